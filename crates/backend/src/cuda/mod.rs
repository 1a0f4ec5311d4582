//! The CUDA backend: weights uploaded once in their GGUF block layout, activations and the
//! paged f16 KV cache in device memory, and one stream on which every operation is queued.
//!
//! The driver is loaded at run time (cudarc's dynamic loading), so a binary built without CUDA
//! runs anywhere; [`CudaBackend::new`] checks for the driver, the device and a kernel image
//! built for exactly the device's architecture before anything else touches CUDA, and says
//! which is missing.

mod kernels;

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use lucebox_gguf::{GgmlType, GgufFile};
use lucebox_quant::{Isa, WeightFormat};

use crate::checks::{self, Dims};
use crate::{
    AttentionShape, Backend, BatchCapacity, Error, KvLayout, RaggedBatch, Rope, RopeStyle,
};
use kernels::Kernels;

const NAME: &str = "cuda";

/// Threads per block of the row-wise kernels.
const ROW_THREADS: u32 = 256;
/// Warps per block of the kernels that give each warp one item (must match the kernels).
const WARPS_PER_BLOCK: u32 = 4;
/// The longest head the attention kernel holds in registers (`ATTENTION_MAX_PER_LANE * 32`).
const MAX_HEAD_DIM: usize = 256;

/// The CUDA backend on one device.
pub struct CudaBackend {
    stream: Arc<CudaStream>,
    kernels: Kernels,
    device: String,
    sm: u32,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.device)
            .field("sm", &self.sm)
            .finish_non_exhaustive()
    }
}

fn unavailable(reason: String) -> Error {
    Error::Unavailable {
        backend: NAME,
        reason,
    }
}

/// Maps a driver error of `op` to the backend's error.
fn driver_error(op: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |e| Error::Device {
        backend: NAME,
        op,
        detail: e.to_string(),
    }
}

impl CudaBackend {
    /// The backend on device `ordinal`.
    pub fn new(ordinal: usize) -> Result<Self, Error> {
        // SAFETY: only probes whether the driver library can be opened; cudarc would panic on
        // first use without it.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(unavailable(
                "no CUDA driver (libcuda.so) on this machine: install the NVIDIA driver, or use \
                 the CPU backend"
                    .into(),
            ));
        }
        let count = CudaContext::device_count()
            .map_err(|e| unavailable(format!("the CUDA driver reports no devices: {e}")))?;
        if ordinal >= count.max(0) as usize {
            return Err(unavailable(format!(
                "device {ordinal} does not exist: the driver sees {count} CUDA device(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| unavailable(format!("cannot open CUDA device {ordinal}: {e}")))?;
        let (major, minor) = ctx.compute_capability().map_err(driver_error("init"))?;
        let sm = (major * 10 + minor) as u32;
        let name = ctx.name().map_err(driver_error("init"))?;
        let device = format!("{name}, sm_{sm}");
        let kernels =
            Kernels::load(&ctx, sm).map_err(|reason| unavailable(format!("{device}: {reason}")))?;
        // SAFETY: every operation of this backend runs on its one stream, in issue order, so
        // cudarc's per-buffer events (for work on several streams) are not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver_error("init"))?;
        Ok(Self {
            stream,
            kernels,
            device,
            sm,
        })
    }

    /// The compute capability the kernels were built for, as `86` for sm_86.
    pub fn sm(&self) -> u32 {
        self.sm
    }

    fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        len: usize,
        what: &'static str,
    ) -> Result<CudaSlice<T>, Error> {
        self.stream
            .alloc_zeros(len.max(1))
            .map_err(|_| Error::OutOfMemory {
                what,
                bytes: (len * size_of::<T>()) as u64,
            })
    }

    /// Copies `host` to the start of `device` (set_batch has checked that it fits).
    fn upload<T: cudarc::driver::DeviceRepr>(
        &self,
        host: &[T],
        device: &mut CudaSlice<T>,
    ) -> Result<(), Error> {
        if host.is_empty() {
            return Ok(());
        }
        self.stream
            .memcpy_htod(host, &mut device.slice_mut(..host.len()))
            .map_err(driver_error("set_batch"))
    }

    fn launch<'a>(
        &'a self,
        op: &'static str,
        function: &'a CudaFunction,
        grid: u32,
        block: u32,
        args: impl FnOnce(&mut cudarc::driver::LaunchArgs<'a>),
    ) -> Result<(), Error> {
        if grid == 0 {
            return Ok(());
        }
        let mut builder = self.stream.launch_builder(function);
        args(&mut builder);
        let config = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: each kernel's arguments are pushed in its signature's order with its types
        // (kernels/cuda/*.cu), and the callers checked every size the kernel indexes with.
        unsafe { builder.launch(config) }
            .map(|_| ())
            .map_err(driver_error(op))
    }
}

/// A weight matrix in device memory, in its GGUF block layout.
pub struct CudaMatrix {
    data: CudaSlice<u8>,
    format: FormatKernels,
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

impl std::fmt::Debug for CudaMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaMatrix")
            .field("type", &self.format.ty)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish_non_exhaustive()
    }
}

/// The kernels of one storage format.
#[derive(Clone)]
pub(crate) struct FormatKernels {
    ty: GgmlType,
    mmv: CudaFunction,
    get_rows: CudaFunction,
}

/// An f32 vector in device memory.
#[derive(Debug)]
pub struct CudaVector {
    data: CudaSlice<f32>,
    len: usize,
}

/// A row-major f32 matrix in device memory.
#[derive(Debug)]
pub struct CudaActivations {
    data: CudaSlice<f32>,
    rows: usize,
    cols: usize,
}

impl CudaActivations {
    fn dims(&self) -> Dims {
        Dims {
            rows: self.rows,
            cols: self.cols,
        }
    }
}

/// A KV cache pool in device memory: per layer, `[block][slot][kv_head][head_dim]` in f16.
#[derive(Debug)]
pub struct CudaKvCache {
    layout: KvLayout,
    k: Vec<CudaSlice<u16>>,
    v: Vec<CudaSlice<u16>>,
}

/// A batch's metadata in device buffers of fixed capacity, with the host copy the checks read.
#[derive(Debug)]
pub struct CudaBatch {
    capacity: BatchCapacity,
    rope: Rope,
    host: RaggedBatch,
    table_offsets: Vec<u32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    device: DeviceBatch,
}

#[derive(Debug)]
struct DeviceBatch {
    tokens: CudaSlice<u32>,
    positions: CudaSlice<u32>,
    table_offsets: CudaSlice<u32>,
    block_ids: CudaSlice<u32>,
    logits_rows: CudaSlice<u32>,
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
}

/// A null device pointer, for an absent optional argument.
const NULL: u64 = 0;

impl Backend for CudaBackend {
    type Matrix = CudaMatrix;
    type Vector = CudaVector;
    type Activations = CudaActivations;
    type KvCache = CudaKvCache;
    type Batch = CudaBatch;

    fn describe(&self) -> String {
        format!("{NAME} ({})", self.device)
    }

    fn load_matrix(&self, file: &Arc<GgufFile>, name: &str) -> Result<CudaMatrix, Error> {
        let (view, [cols, rows]) = checks::tensor("load_matrix", file, name)?;
        let format =
            self.kernels
                .format(view.ggml_type())
                .ok_or_else(|| Error::UnsupportedType {
                    tensor: name.to_owned(),
                    ty: view.ggml_type(),
                    backend: NAME,
                })?;
        let bytes = view.data();
        let data = self
            .stream
            .clone_htod(bytes)
            .map_err(|_| Error::OutOfMemory {
                what: "weights",
                bytes: bytes.len() as u64,
            })?;
        Ok(CudaMatrix {
            data,
            format,
            rows,
            cols,
            row_bytes: bytes.len() / rows.max(1),
        })
    }

    fn load_vector(&self, file: &Arc<GgufFile>, name: &str) -> Result<CudaVector, Error> {
        let (view, [len]) = checks::tensor("load_vector", file, name)?;
        let format = WeightFormat::new(view.ggml_type(), Isa::detect()).map_err(|_| {
            Error::UnsupportedType {
                tensor: name.to_owned(),
                ty: view.ggml_type(),
                backend: NAME,
            }
        })?;
        let mut values = vec![0.0; len];
        format.dequantize(view.data(), &mut values);
        let data = self
            .stream
            .clone_htod(&values)
            .map_err(driver_error("load_vector"))?;
        Ok(CudaVector { data, len })
    }

    fn vector_len(&self, v: &CudaVector) -> usize {
        v.len
    }

    fn matrix_shape(&self, m: &CudaMatrix) -> (usize, usize) {
        (m.rows, m.cols)
    }

    fn activations(&self, rows: usize, cols: usize) -> Result<CudaActivations, Error> {
        let len = rows.checked_mul(cols).ok_or(Error::OutOfMemory {
            what: "activations",
            bytes: u64::MAX,
        })?;
        Ok(CudaActivations {
            data: self.zeros(len, "activations")?,
            rows,
            cols,
        })
    }

    fn kv_cache(&self, layout: KvLayout) -> Result<CudaKvCache, Error> {
        let per_layer = layout.blocks * layout.block_tokens * layout.kv_heads * layout.head_dim;
        let layer = || self.zeros::<u16>(per_layer, "kv cache");
        let k = (0..layout.layers)
            .map(|_| layer())
            .collect::<Result<_, _>>()?;
        let v = (0..layout.layers)
            .map(|_| layer())
            .collect::<Result<_, _>>()?;
        Ok(CudaKvCache { layout, k, v })
    }

    fn batch(&self, capacity: BatchCapacity, rope: Rope) -> Result<CudaBatch, Error> {
        let half_rot = rope.rotary_dims / 2;
        let tables = capacity.tokens * half_rot;
        Ok(CudaBatch {
            capacity,
            rope,
            host: RaggedBatch::new(),
            table_offsets: Vec::with_capacity(capacity.tokens),
            cos: vec![0.0; tables],
            sin: vec![0.0; tables],
            device: DeviceBatch {
                tokens: self.zeros(capacity.tokens, "batch")?,
                positions: self.zeros(capacity.tokens, "batch")?,
                table_offsets: self.zeros(capacity.tokens, "batch")?,
                block_ids: self.zeros(capacity.blocks, "batch")?,
                logits_rows: self.zeros(capacity.logits, "batch")?,
                cos: self.zeros(tables, "rope table")?,
                sin: self.zeros(tables, "rope table")?,
            },
        })
    }

    fn set_batch(&self, dst: &mut CudaBatch, src: &RaggedBatch) -> Result<(), Error> {
        checks::set_batch(src, dst.capacity)?;
        dst.host.copy_from(src);
        dst.table_offsets.clear();
        dst.table_offsets.extend(
            src.token_seqs()
                .iter()
                .map(|&seq| src.seqs[seq as usize].blocks_start),
        );
        // Each token's cosines and sines: rotary_dims / 2 of each.
        let tables = src.len() * (dst.rope.rotary_dims / 2);
        dst.rope.tables(
            src.positions(),
            &mut dst.cos[..tables],
            &mut dst.sin[..tables],
        );
        let d = &mut dst.device;
        self.upload(src.tokens(), &mut d.tokens)?;
        self.upload(src.positions(), &mut d.positions)?;
        self.upload(&dst.table_offsets, &mut d.table_offsets)?;
        self.upload(&src.block_ids, &mut d.block_ids)?;
        self.upload(src.logits_rows(), &mut d.logits_rows)?;
        self.upload(&dst.cos[..tables], &mut d.cos)?;
        self.upload(&dst.sin[..tables], &mut d.sin)?;
        Ok(())
    }

    fn embed(
        &self,
        table: &CudaMatrix,
        batch: &CudaBatch,
        out: &mut CudaActivations,
    ) -> Result<(), Error> {
        checks::embed(&batch.host, (table.rows, table.cols), out.dims())?;
        let tokens = batch.host.tokens();
        let (row_bytes, cols) = (table.row_bytes as u64, table.cols as i32);
        self.launch(
            "embed",
            &table.format.get_rows,
            tokens.len() as u32,
            ROW_THREADS,
            |b| {
                b.arg(&table.data)
                    .arg(&row_bytes)
                    .arg(&cols)
                    .arg(&batch.device.tokens)
                    .arg(&mut out.data);
            },
        )
    }

    fn rms_norm(
        &self,
        x: &CudaActivations,
        weight: &CudaVector,
        eps: f32,
        rows: usize,
        out: &mut CudaActivations,
    ) -> Result<(), Error> {
        checks::rms_norm(rows, x.dims(), weight.len, out.dims())?;
        let cols = x.cols as i32;
        self.launch(
            "rms_norm",
            &self.kernels.rms_norm,
            rows as u32,
            ROW_THREADS,
            |b| {
                b.arg(&x.data)
                    .arg(&weight.data)
                    .arg(&eps)
                    .arg(&cols)
                    .arg(&mut out.data);
            },
        )
    }

    fn rms_norm_heads(
        &self,
        x: &mut CudaActivations,
        weight: &CudaVector,
        eps: f32,
        rows: usize,
    ) -> Result<(), Error> {
        let head_dim = weight.len;
        checks::rms_norm_heads(rows, x.dims(), head_dim)?;
        let heads = (rows * x.cols / head_dim) as i32;
        let grid = (heads as u32).div_ceil(WARPS_PER_BLOCK);
        let head_dim = head_dim as i32;
        self.launch(
            "rms_norm_heads",
            &self.kernels.rms_norm_heads,
            grid,
            WARPS_PER_BLOCK * 32,
            |b| {
                b.arg(&mut x.data)
                    .arg(&weight.data)
                    .arg(&eps)
                    .arg(&head_dim)
                    .arg(&heads);
            },
        )
    }

    fn matmul(
        &self,
        matrix: &CudaMatrix,
        bias: Option<&CudaVector>,
        x: &CudaActivations,
        rows: usize,
        out: &mut CudaActivations,
    ) -> Result<(), Error> {
        checks::matmul(
            rows,
            (matrix.rows, matrix.cols),
            bias.map(|b| b.len),
            x.dims(),
            out.dims(),
        )?;
        // One block of WARPS_PER_BLOCK warps per weight row.
        let grid = matrix.rows as u32;
        let (row_bytes, out_rows, cols, tokens) = (
            matrix.row_bytes as u64,
            matrix.rows as i32,
            matrix.cols as i32,
            rows as i32,
        );
        self.launch(
            "matmul",
            &matrix.format.mmv,
            grid,
            WARPS_PER_BLOCK * 32,
            |b| {
                b.arg(&matrix.data)
                    .arg(&row_bytes)
                    .arg(&out_rows)
                    .arg(&cols)
                    .arg(&x.data)
                    .arg(&tokens);
                match bias {
                    Some(bias) => b.arg(&bias.data),
                    None => b.arg(&NULL),
                };
                b.arg(&mut out.data);
            },
        )
    }

    fn rope(
        &self,
        x: &mut CudaActivations,
        batch: &CudaBatch,
        head_dim: usize,
    ) -> Result<(), Error> {
        let rotary_dims = batch.rope.rotary_dims;
        checks::rope(&batch.host, x.dims(), head_dim, rotary_dims)?;
        let rows = batch.host.len();
        let neox = i32::from(batch.rope.style == RopeStyle::Neox);
        let (cols, head_dim, rotary_dims) = (x.cols as i32, head_dim as i32, rotary_dims as i32);
        self.launch("rope", &self.kernels.rope, rows as u32, ROW_THREADS, |b| {
            b.arg(&mut x.data)
                .arg(&batch.device.cos)
                .arg(&batch.device.sin)
                .arg(&cols)
                .arg(&head_dim)
                .arg(&rotary_dims)
                .arg(&neox);
        })
    }

    fn store_kv(
        &self,
        cache: &mut CudaKvCache,
        layer: usize,
        k: &CudaActivations,
        v: &CudaActivations,
        batch: &CudaBatch,
    ) -> Result<(), Error> {
        let l = cache.layout;
        checks::store_kv(&l, layer, &batch.host, k.dims(), v.dims())?;
        let width = l.kv_heads * l.head_dim;
        let rows = batch.host.len();
        let (block_tokens, width) = (l.block_tokens as i32, width as i32);
        let CudaKvCache { k: ks, v: vs, .. } = cache;
        let (k_cache, v_cache) = (&mut ks[layer], &mut vs[layer]);
        let d = &batch.device;
        self.launch(
            "store_kv",
            &self.kernels.store_kv,
            rows as u32,
            ROW_THREADS,
            |b| {
                b.arg(&k.data)
                    .arg(&v.data)
                    .arg(&d.positions)
                    .arg(&d.table_offsets)
                    .arg(&d.block_ids)
                    .arg(&block_tokens)
                    .arg(&width)
                    .arg(k_cache)
                    .arg(v_cache);
            },
        )
    }

    fn attention(
        &self,
        q: &CudaActivations,
        cache: &CudaKvCache,
        layer: usize,
        batch: &CudaBatch,
        shape: AttentionShape,
        out: &mut CudaActivations,
    ) -> Result<(), Error> {
        let l = cache.layout;
        checks::attention(
            &l,
            layer,
            &batch.host,
            shape,
            Some(MAX_HEAD_DIM),
            q.dims(),
            out.dims(),
        )?;
        let rows = batch.host.len();
        let items = (rows * shape.heads) as u32;
        let d = &batch.device;
        let (block_tokens, tokens, heads, kv_heads, head_dim) = (
            l.block_tokens as i32,
            rows as i32,
            shape.heads as i32,
            shape.kv_heads as i32,
            shape.head_dim as i32,
        );
        self.launch(
            "attention",
            &self.kernels.attention,
            items.div_ceil(WARPS_PER_BLOCK),
            WARPS_PER_BLOCK * 32,
            |b| {
                b.arg(&q.data)
                    .arg(&cache.k[layer])
                    .arg(&cache.v[layer])
                    .arg(&d.positions)
                    .arg(&d.table_offsets)
                    .arg(&d.block_ids)
                    .arg(&block_tokens)
                    .arg(&tokens)
                    .arg(&heads)
                    .arg(&kv_heads)
                    .arg(&head_dim)
                    .arg(&shape.scale)
                    .arg(&mut out.data);
            },
        )
    }

    fn silu_mul(
        &self,
        gate: &mut CudaActivations,
        up: &CudaActivations,
        rows: usize,
    ) -> Result<(), Error> {
        checks::elementwise("silu_mul", rows, gate.dims(), up.dims())?;
        let n = (rows * gate.cols) as u64;
        self.launch(
            "silu_mul",
            &self.kernels.silu_mul,
            elementwise_grid(n),
            ROW_THREADS,
            |b| {
                b.arg(&mut gate.data).arg(&up.data).arg(&n);
            },
        )
    }

    fn add(&self, x: &mut CudaActivations, y: &CudaActivations, rows: usize) -> Result<(), Error> {
        checks::elementwise("add", rows, x.dims(), y.dims())?;
        let n = (rows * x.cols) as u64;
        self.launch(
            "add",
            &self.kernels.add,
            elementwise_grid(n),
            ROW_THREADS,
            |b| {
                b.arg(&mut x.data).arg(&y.data).arg(&n);
            },
        )
    }

    fn gather_logits_rows(
        &self,
        x: &CudaActivations,
        batch: &CudaBatch,
        out: &mut CudaActivations,
    ) -> Result<(), Error> {
        checks::gather_logits_rows(&batch.host, x.dims(), out.dims())?;
        let wanted = batch.host.logits_rows();
        let cols = x.cols as i32;
        self.launch(
            "gather_logits_rows",
            &self.kernels.gather_rows,
            wanted.len() as u32,
            ROW_THREADS,
            |b| {
                b.arg(&x.data)
                    .arg(&batch.device.logits_rows)
                    .arg(&cols)
                    .arg(&mut out.data);
            },
        )
    }

    fn read_rows(&self, x: &CudaActivations, rows: usize, out: &mut [f32]) -> Result<(), Error> {
        checks::read_rows(rows, x.dims(), out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        self.stream
            .memcpy_dtoh(&x.data.slice(..out.len()), out)
            .map_err(driver_error("read_rows"))?;
        self.stream.synchronize().map_err(driver_error("read_rows"))
    }

    fn argmax_rows(&self, x: &CudaActivations, out: &mut [u32]) -> Result<(), Error> {
        checks::rows("argmax_rows", out.len(), x.rows)?;
        if out.is_empty() {
            return Ok(());
        }
        let mut best = self.zeros::<u32>(out.len(), "argmax")?;
        let cols = x.cols as i32;
        self.launch(
            "argmax_rows",
            &self.kernels.argmax_rows,
            out.len() as u32,
            ROW_THREADS,
            |b| {
                b.arg(&x.data).arg(&cols).arg(&mut best);
            },
        )?;
        self.stream
            .memcpy_dtoh(&best, out)
            .map_err(driver_error("argmax_rows"))?;
        self.stream
            .synchronize()
            .map_err(driver_error("argmax_rows"))
    }
}

/// Blocks for a grid-stride loop over `n` elements.
fn elementwise_grid(n: u64) -> u32 {
    n.div_ceil(u64::from(ROW_THREADS)).min(4096) as u32
}
