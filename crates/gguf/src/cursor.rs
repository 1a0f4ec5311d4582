//! Bounds-checked little-endian reads over the file's bytes.

use crate::error::{Error, ErrorKind};
use crate::value::{Array, Value, ValueType};

/// The longest string accepted anywhere in a file. Chat templates, the longest strings seen in
/// real files, are tens of kilobytes.
pub const MAX_STRING_BYTES: u64 = 16 << 20;
/// The most elements accepted in one metadata array. Real vocabularies hold under a million.
pub const MAX_ARRAY_LEN: u64 = 1 << 24;
/// How deep arrays of arrays may nest.
pub const MAX_ARRAY_DEPTH: u32 = 4;

pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    pub(crate) fn pos(&self) -> u64 {
        self.pos as u64
    }

    pub(crate) fn left(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, field: &dyn Fn() -> String) -> Result<&'a [u8], Error> {
        if n > self.left() {
            return Err(Error::new(
                ErrorKind::Truncated {
                    needed: n,
                    left: self.left(),
                },
                field(),
                self.pos(),
            ));
        }
        // `n <= left`, and left fits in usize, so the cast and the addition are exact.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self, field: &dyn Fn() -> String) -> Result<[u8; N], Error> {
        let bytes = self.take(N as u64, field)?;
        Ok(bytes.try_into().expect("take returned exactly N bytes"))
    }

    pub(crate) fn magic(&mut self) -> Result<[u8; 4], Error> {
        self.array(&|| "header.magic".into())
    }

    pub(crate) fn u32(&mut self, field: &dyn Fn() -> String) -> Result<u32, Error> {
        self.array(field).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, field: &dyn Fn() -> String) -> Result<u64, Error> {
        self.array(field).map(u64::from_le_bytes)
    }

    /// Reads a count of items that each take at least `min_item_bytes`, and refuses one that the
    /// rest of the file could not hold or that exceeds `cap`, before anything is allocated for it.
    pub(crate) fn count(
        &mut self,
        min_item_bytes: u64,
        cap: u64,
        field: &dyn Fn() -> String,
    ) -> Result<u64, Error> {
        let at = self.pos();
        let n = self.u64(field)?;
        let limit = (self.left() / min_item_bytes.max(1)).min(cap);
        if n > limit {
            return Err(Error::new(
                ErrorKind::TooLarge { value: n, limit },
                field(),
                at,
            ));
        }
        Ok(n)
    }

    pub(crate) fn string(&mut self, field: &dyn Fn() -> String) -> Result<String, Error> {
        let len = self.count(1, MAX_STRING_BYTES, field)?;
        let at = self.pos();
        let bytes = self.take(len, field)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| Error::new(ErrorKind::InvalidUtf8, field(), at))
    }

    pub(crate) fn value_type(&mut self, field: &dyn Fn() -> String) -> Result<ValueType, Error> {
        let at = self.pos();
        let id = self.u32(field)?;
        ValueType::from_id(id)
            .ok_or_else(|| Error::new(ErrorKind::UnknownValueType(id), field(), at))
    }

    pub(crate) fn value(
        &mut self,
        ty: ValueType,
        depth: u32,
        field: &dyn Fn() -> String,
    ) -> Result<Value, Error> {
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array(field)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(field)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(field)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(field)?)),
            ValueType::U32 => Value::U32(self.u32(field)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(field)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(field)?)),
            ValueType::Bool => Value::Bool(self.bool(field)?),
            ValueType::String => Value::String(self.string(field)?),
            ValueType::Array => Value::Array(self.array_value(depth, field)?),
            ValueType::U64 => Value::U64(self.u64(field)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(field)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(field)?)),
        })
    }

    fn bool(&mut self, field: &dyn Fn() -> String) -> Result<bool, Error> {
        let at = self.pos();
        match self.array::<1>(field)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(Error::invalid(
                field(),
                at,
                format!("bool byte is {b}, not 0 or 1"),
            )),
        }
    }

    fn array_value(&mut self, depth: u32, field: &dyn Fn() -> String) -> Result<Array, Error> {
        let at = self.pos();
        if depth >= MAX_ARRAY_DEPTH {
            return Err(Error::invalid(
                field(),
                at,
                format!("arrays nest deeper than {MAX_ARRAY_DEPTH} levels"),
            ));
        }
        let ty = self.value_type(field)?;
        let len = self.count(ty.min_encoded_len(), MAX_ARRAY_LEN, field)?;
        // `len` is bounded by the bytes left, so this allocation is proportional to the file.
        let len = len as usize;
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                let bytes = self.take((len * size_of::<$t>()) as u64, field)?;
                Array::$variant(
                    bytes
                        .chunks_exact(size_of::<$t>())
                        .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk of exact size")))
                        .collect(),
                )
            }};
        }
        Ok(match ty {
            ValueType::U8 => fixed!(U8, u8),
            ValueType::I8 => fixed!(I8, i8),
            ValueType::U16 => fixed!(U16, u16),
            ValueType::I16 => fixed!(I16, i16),
            ValueType::U32 => fixed!(U32, u32),
            ValueType::I32 => fixed!(I32, i32),
            ValueType::F32 => fixed!(F32, f32),
            ValueType::U64 => fixed!(U64, u64),
            ValueType::I64 => fixed!(I64, i64),
            ValueType::F64 => fixed!(F64, f64),
            ValueType::Bool => Array::Bool(
                (0..len)
                    .map(|_| self.bool(field))
                    .collect::<Result<_, _>>()?,
            ),
            ValueType::String => Array::String(
                (0..len)
                    .map(|_| self.string(field))
                    .collect::<Result<_, _>>()?,
            ),
            ValueType::Array => Array::Array(
                (0..len)
                    .map(|_| self.array_value(depth + 1, field))
                    .collect::<Result<_, _>>()?,
            ),
        })
    }
}
