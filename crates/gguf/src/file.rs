use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use crate::cursor::Cursor;
use crate::error::{Error, ErrorKind};
use crate::ggml_type::GgmlType;
use crate::known_keys;
use crate::metadata::Metadata;

/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The largest `general.alignment` accepted.
pub const MAX_ALIGNMENT: u64 = 1 << 20;
/// The most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// The longest tensor name accepted (ggml's `GGML_MAX_NAME` less its terminating NUL).
pub const MAX_TENSOR_NAME_BYTES: u64 = 63;
/// The most metadata entries accepted in one file.
const MAX_KV: u64 = 1 << 20;
/// The most tensors accepted in one file.
const MAX_TENSORS: u64 = 1 << 20;
/// The fewest bytes one metadata entry takes: key length, value type, one byte of value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// The fewest bytes one tensor info takes: name length, n_dims, one dim, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// One tensor's description from the file's tensor-info table.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    /// Offset of the data from the start of the data section.
    offset: u64,
    bytes: u64,
    info_offset: u64,
}

impl TensorInfo {
    /// The tensor's name, such as `blk.0.attn_q.weight`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The dimensions in ggml order: `dims()[0]` is the contiguous one (a matrix row's length).
    pub fn dims(&self) -> &[u64] {
        &self.dims
    }

    /// The storage type.
    pub fn ggml_type(&self) -> GgmlType {
        self.ggml_type
    }

    /// The number of elements.
    pub fn elements(&self) -> u64 {
        // Checked at parse time not to overflow.
        self.dims.iter().product()
    }

    /// Where the tensor's data starts, counted from the start of the data section
    /// ([`GgufFile::data_offset`]); a multiple of the file's alignment.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The size of the tensor's data in bytes.
    pub fn byte_len(&self) -> u64 {
        self.bytes
    }

    /// Where this tensor's entry in the tensor-info table starts, for error messages.
    pub fn info_offset(&self) -> u64 {
        self.info_offset
    }
}

/// A tensor's description together with its bytes, borrowed from the file without copying.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    info: &'a TensorInfo,
    data: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// The tensor's description.
    pub fn info(&self) -> &'a TensorInfo {
        self.info
    }

    /// The tensor's name.
    pub fn name(&self) -> &'a str {
        &self.info.name
    }

    /// The dimensions in ggml order.
    pub fn dims(&self) -> &'a [u64] {
        &self.info.dims
    }

    /// The storage type.
    pub fn ggml_type(&self) -> GgmlType {
        self.info.ggml_type
    }

    /// The raw bytes, exactly [`TensorInfo::byte_len`] of them.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }
}

enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A parsed and validated GGUF file whose tensor data stays in the memory map.
pub struct GgufFile {
    storage: Storage,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("bytes", &self.storage.bytes().len())
            .field("metadata_entries", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl GgufFile {
    /// Maps and parses the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let io = |e| Error::new(ErrorKind::Io(e), path.display().to_string(), 0);
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. Model files are treated as
        // immutable while served; another process truncating the file under us would fault, which
        // is the accepted contract of every memory-mapped model loader (llama.cpp included).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::parse(Storage::Mapped(map))
    }

    /// Parses a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, Error> {
        Self::parse(Storage::Owned(bytes))
    }

    fn parse(storage: Storage) -> Result<Self, Error> {
        let bytes = storage.bytes();
        let mut c = Cursor::new(bytes);
        let magic = c.magic()?;
        if &magic != b"GGUF" {
            return Err(Error::new(ErrorKind::BadMagic(magic), "header.magic", 0));
        }
        let version = c.u32(&|| "header.version".into())?;
        if version != 2 && version != 3 {
            let kind = if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
                ErrorKind::Invalid("big-endian GGUF files are not supported".into())
            } else {
                ErrorKind::UnsupportedVersion(version)
            };
            return Err(Error::new(kind, "header.version", 4));
        }
        let n_tensors = c.count(MIN_TENSOR_INFO_BYTES, MAX_TENSORS, &|| {
            "header.n_tensors".into()
        })?;
        let n_kv = c.count(MIN_KV_BYTES, MAX_KV, &|| "header.n_kv".into())?;

        let mut metadata = Metadata::new(c.pos());
        for i in 0..n_kv {
            let at = c.pos();
            let key = c.string(&|| format!("metadata entry {i} key"))?;
            let ty = c.value_type(&|| key.clone())?;
            let value = c.value(ty, 0, &|| key.clone())?;
            if !metadata.insert(key.clone(), value, at) {
                return Err(Error::new(ErrorKind::Duplicate, key, at));
            }
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(crate::Value::U32(a)) => u64::from(*a),
            Some(other) => return Err(metadata.wrong_type("general.alignment", "u32", other)),
        };
        if !alignment.is_power_of_two() || alignment > MAX_ALIGNMENT {
            return Err(metadata.invalid(
                "general.alignment",
                format!("{alignment} is not a power of two no larger than {MAX_ALIGNMENT}"),
            ));
        }

        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut by_name = HashMap::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let info = read_tensor_info(&mut c, i, alignment)?;
            if by_name.insert(info.name.clone(), tensors.len()).is_some() {
                return Err(Error::new(
                    ErrorKind::Duplicate,
                    info.name,
                    info.info_offset,
                ));
            }
            tensors.push(info);
        }

        let data_offset = c
            .pos()
            .checked_next_multiple_of(alignment)
            .ok_or_else(|| Error::new(ErrorKind::Overflow, "data section", c.pos()))?;
        check_tensor_extents(&tensors, data_offset, bytes.len() as u64)?;
        known_keys::validate(&metadata)?;

        Ok(Self {
            storage,
            version,
            metadata,
            tensors,
            by_name,
            alignment,
            data_offset,
        })
    }

    /// The format version, 2 or 3.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The key/value metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The tensor-info table in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The alignment of tensor data in bytes.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Where the data section starts in the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The tensor called `name`, if the file has one.
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.by_name.get(name).map(|&i| self.view(&self.tensors[i]))
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> {
        self.tensors.iter().map(|info| self.view(info))
    }

    fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        // Extents were checked against the file length at parse time.
        let start = (self.data_offset + info.offset) as usize;
        TensorView {
            info,
            data: &self.storage.bytes()[start..start + info.bytes as usize],
        }
    }
}

fn read_tensor_info(c: &mut Cursor<'_>, index: u64, alignment: u64) -> Result<TensorInfo, Error> {
    let info_offset = c.pos();
    let name = c.string(&|| format!("tensor {index} name"))?;
    if name.len() as u64 > MAX_TENSOR_NAME_BYTES {
        return Err(Error::new(
            ErrorKind::TooLarge {
                value: name.len() as u64,
                limit: MAX_TENSOR_NAME_BYTES,
            },
            format!("tensor {index} name"),
            info_offset,
        ));
    }
    let field = |part: &str| format!("tensor {name} {part}");
    let at = c.pos();
    let n_dims = c.u32(&|| field("n_dims"))?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(Error::invalid(
            field("n_dims"),
            at,
            format!("{n_dims} is not in 1..={MAX_DIMS}"),
        ));
    }
    let dims_at = c.pos();
    let mut dims = Vec::with_capacity(n_dims as usize);
    let mut elements: u64 = 1;
    for d in 0..n_dims {
        let at = c.pos();
        let dim = c.u64(&|| field(&format!("dims[{d}]")))?;
        if dim == 0 || dim > i64::MAX as u64 {
            return Err(Error::invalid(
                field(&format!("dims[{d}]")),
                at,
                format!("{dim} is not in 1..=2^63-1"),
            ));
        }
        elements = elements
            .checked_mul(dim)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or_else(|| Error::new(ErrorKind::Overflow, field("element count"), at))?;
        dims.push(dim);
    }
    let at = c.pos();
    let type_id = c.u32(&|| field("type"))?;
    let ggml_type = GgmlType::from_id(type_id)
        .ok_or_else(|| Error::new(ErrorKind::UnknownTensorType(type_id), field("type"), at))?;
    if !dims[0].is_multiple_of(ggml_type.block_len()) {
        return Err(Error::invalid(
            field("dims[0]"),
            dims_at,
            format!(
                "{} is not a multiple of the {ggml_type} block length {}",
                dims[0],
                ggml_type.block_len()
            ),
        ));
    }
    let bytes = ggml_type
        .bytes_for(elements)
        .ok_or_else(|| Error::new(ErrorKind::Overflow, field("byte size"), info_offset))?;
    let at = c.pos();
    let offset = c.u64(&|| field("offset"))?;
    if !offset.is_multiple_of(alignment) {
        return Err(Error::invalid(
            field("offset"),
            at,
            format!("{offset} is not a multiple of the alignment {alignment}"),
        ));
    }
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        bytes,
        info_offset,
    })
}

/// Every tensor must lie inside the data section, and no two may overlap.
fn check_tensor_extents(
    tensors: &[TensorInfo],
    data_offset: u64,
    file_len: u64,
) -> Result<(), Error> {
    if tensors.is_empty() {
        return Ok(());
    }
    let data_len = file_len.checked_sub(data_offset).ok_or_else(|| {
        Error::new(
            ErrorKind::Truncated {
                needed: data_offset,
                left: file_len,
            },
            "data section",
            file_len,
        )
    })?;
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    let mut previous: Option<(&TensorInfo, u64)> = None;
    for t in order {
        let end = t.offset.checked_add(t.bytes).ok_or_else(|| {
            Error::new(
                ErrorKind::Overflow,
                format!("tensor {} extent", t.name),
                t.info_offset,
            )
        })?;
        if end > data_len {
            return Err(Error::invalid(
                format!("tensor {} extent", t.name),
                t.info_offset,
                format!(
                    "data [{}, {end}) ends past the data section of {data_len} bytes",
                    t.offset
                ),
            ));
        }
        if let Some((p, p_end)) = previous
            && t.offset < p_end
        {
            return Err(Error::invalid(
                format!("tensor {} extent", t.name),
                t.info_offset,
                format!(
                    "data starting at {} overlaps tensor {}, which ends at {p_end}",
                    t.offset, p.name
                ),
            ));
        }
        previous = Some((t, end));
    }
    Ok(())
}
