//! The CUDA backend: weights uploaded once in their GGUF block layout, activations and the
//! paged f16 KV cache in device memory, and one stream on which every operation is queued.
//!
//! The driver is loaded at run time (cudarc's dynamic loading), so a binary built without CUDA
//! runs anywhere; [`CudaBackend::new`] checks for the driver, the device and a kernel image
//! built for exactly the device's architecture before anything else touches CUDA, and says
//! which is missing.

mod kernels;

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUdevice_attribute, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    DriverError, LaunchConfig, PushKernelArg,
};
use lucebox_gguf::{GgmlType, GgufFile};
use lucebox_quant::{Isa, WeightFormat};

use crate::checks::{self, Dims, HeadDims};
use crate::{
    AttentionShape, Backend, BatchCapacity, Error, KvLayout, PassShape, RaggedBatch, Rope,
    RopeStyle,
};
use kernels::Kernels;

const NAME: &str = "cuda";

/// Threads per block of the row-wise kernels.
const ROW_THREADS: u32 = 256;
/// Warps per block of the kernels that give each warp one item, such as a weight row (must
/// match the kernels).
const WARPS_PER_BLOCK: u32 = 4;
/// The heads the attention kernel takes: each lane holds head_dim / 32 dimensions, at most
/// `ATTENTION_MAX_PER_LANE`.
const HEAD_DIMS: HeadDims = HeadDims {
    max: 256,
    multiple_of: 32,
};
/// Warps per block of the attention kernel (`ATTENTION_WARPS`).
const ATTENTION_WARPS: u32 = 4;
/// The largest forward pass recorded as a graph: decode and verify steps, whose hundreds of
/// short kernels cost more to launch one by one than to run. Longer prefill passes are
/// dominated by their matrix products.
const RECORD_MAX_TOKENS: usize = 64;
/// The most graphs one workspace keeps (one per batch shape seen).
const RECORD_MAX_GRAPHS: usize = 256;

/// The CUDA backend on one device.
pub struct CudaBackend {
    stream: Arc<CudaStream>,
    kernels: Kernels,
    device: String,
    sm: u32,
    /// Bytes per second: the memory clock (double data rate) times the bus width.
    peak_bandwidth: Option<f64>,
    /// Whether forward passes are recorded and replayed as CUDA graphs
    /// (`LUCEBOX_CUDA_GRAPHS=0` turns them off, to compare, to debug, or to profile each kernel
    /// with `ncu`).
    graphs: bool,
    /// The device-side result of [`Backend::argmax_rows`], grown to the most rows asked for.
    argmax: Mutex<Option<CudaSlice<u32>>>,
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
        let attribute = |a| ctx.attribute(a).ok().filter(|&v| v > 0).map(f64::from);
        let peak_bandwidth = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)
            .zip(attribute(
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH,
            ))
            .map(|(khz, bits)| 2.0 * khz * 1e3 * bits / 8.0);
        let device = format!("{name}, sm_{sm}");
        let kernels =
            Kernels::load(&ctx, sm).map_err(|reason| unavailable(format!("{device}: {reason}")))?;
        // SAFETY: every operation of this backend runs on its one stream, in issue order, so
        // cudarc's per-buffer events (for work on several streams) are not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver_error("init"))?;
        let graphs = std::env::var_os("LUCEBOX_CUDA_GRAPHS").is_none_or(|v| v != "0");
        Ok(Self {
            stream,
            kernels,
            device,
            sm,
            peak_bandwidth,
            graphs,
            argmax: Mutex::new(None),
        })
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

    /// The quantized copy of the first `rows` rows of `x`, made unless the operations issued
    /// since `x` was last written already made it.
    fn quantize<'a>(&self, x: &'a CudaActivations, rows: usize) -> Result<&'a Quantized, Error> {
        let quantized = x.quantized.as_ref().ok_or_else(|| Error::Shape {
            op: "matmul",
            detail: format!(
                "quantized weights take activations whose width is a multiple of \
                 {QUANT_GROUP}, not {}",
                x.cols
            ),
        })?;
        if x.quantized_rows.get() < rows {
            let groups = (rows * x.cols / QUANT_GROUP) as i64;
            let grid = (groups as u64).div_ceil(u64::from(WARPS_PER_BLOCK)) as u32;
            self.launch(
                "quantize",
                &self.kernels.quantize_q8,
                grid,
                WARPS_PER_BLOCK * 32,
                |b| {
                    b.arg(&x.data)
                        .arg(&groups)
                        .arg(&quantized.hi)
                        .arg(&quantized.lo)
                        .arg(&quantized.scales)
                        .arg(&quantized.sums);
                },
            )?;
            x.quantized_rows.set(rows);
        }
        Ok(quantized)
    }

    /// Records what `enqueue` issues on the stream as a graph, without running it.
    fn record<F>(&self, cache: &mut CudaKvCache, enqueue: F) -> Result<Graph, Error>
    where
        F: FnOnce(&mut CudaKvCache) -> Result<(), Error>,
    {
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver_error("record"))?;
        let issued = enqueue(cache);
        // The capture ends whatever happened, so that the stream is usable again.
        let graph = self.stream.end_capture(CUgraphInstantiate_flags(0));
        issued?;
        match graph.map_err(driver_error("record"))? {
            Some(graph) => Ok(Graph(graph)),
            None => Err(Error::Device {
                backend: NAME,
                op: "record",
                detail: "the captured forward pass is empty".into(),
            }),
        }
    }
}

/// An instantiated CUDA graph of one forward pass.
struct Graph(CudaGraph);

// SAFETY: CUDA graphs are not internally synchronised, so every use must be serialised; a
// graph lives in `CudaRecordings`, which is only used through `&mut`, so by one thread at a
// time.
unsafe impl Send for Graph {}

/// The forward passes recorded for one workspace, by shape and KV cache.
#[derive(Default)]
pub struct CudaRecordings {
    graphs: HashMap<(PassShape, u64), Graph>,
}

impl std::fmt::Debug for CudaRecordings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaRecordings")
            .field("graphs", &self.graphs.len())
            .finish()
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
    /// The matvec for any number of activation rows: over f32 activations for the float
    /// formats, over quantized activations for the others.
    mmv: CudaFunction,
    /// The quantized formats' kernels.
    quantized: Option<QuantizedKernels>,
    get_rows: CudaFunction,
}

/// The kernels only the quantized formats have.
#[derive(Clone)]
pub(crate) struct QuantizedKernels {
    /// The matvec of exactly one activation row (a decode step).
    mmv1: CudaFunction,
}

/// An f32 vector in device memory.
#[derive(Debug)]
pub struct CudaVector {
    data: CudaSlice<f32>,
    len: usize,
}

/// A row-major f32 matrix in device memory, with room for its copy quantized for the matvec.
#[derive(Debug)]
pub struct CudaActivations {
    data: CudaSlice<f32>,
    rows: usize,
    cols: usize,
    /// Present when `cols` is a multiple of 32 (every quantized matrix's width).
    quantized: Option<Quantized>,
    /// How many leading rows `quantized` holds, as of the operations issued so far; every
    /// operation that writes the matrix resets it through [`written`](Self::written).
    quantized_rows: Cell<usize>,
}

/// Activations quantized in groups of 32, in two 8-bit parts (kernels/cuda/quantize.cu).
#[derive(Debug)]
struct Quantized {
    hi: CudaSlice<i8>,
    lo: CudaSlice<i8>,
    /// `(d_hi, d_lo)` per group.
    scales: CudaSlice<f32>,
    /// `d_hi * sum(hi) + d_lo * sum(lo)` per 16 values.
    sums: CudaSlice<f32>,
}

impl CudaActivations {
    fn dims(&self) -> Dims {
        Dims {
            rows: self.rows,
            cols: self.cols,
        }
    }

    /// The data, for an operation that writes it: its quantized copy is stale from then on.
    fn written(&mut self) -> &mut CudaSlice<f32> {
        self.quantized_rows.set(0);
        &mut self.data
    }

    /// The data and where its quantized copy goes, for a kernel that writes both for the first
    /// `rows` rows (nulls when the width cannot be quantized, and the kernel writes the data
    /// only).
    fn written_quantized(
        &mut self,
        stream: &CudaStream,
        rows: usize,
    ) -> (&mut CudaSlice<f32>, QuantizedOut) {
        let out = match &self.quantized {
            Some(q) => {
                self.quantized_rows.set(rows);
                QuantizedOut {
                    hi: q.hi.device_ptr(stream).0,
                    lo: q.lo.device_ptr(stream).0,
                    scales: q.scales.device_ptr(stream).0,
                    sums: q.sums.device_ptr(stream).0,
                }
            }
            None => {
                self.quantized_rows.set(0);
                QuantizedOut::default()
            }
        };
        (&mut self.data, out)
    }
}

/// The device pointers of a [`Quantized`] copy, laid out as the kernels' `QuantizedOut`
/// (kernels/cuda/q8.cuh); all null for none.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct QuantizedOut {
    hi: u64,
    lo: u64,
    scales: u64,
    sums: u64,
}

// SAFETY: four device pointers in a `repr(C)` struct, passed by value as the kernels'
// `QuantizedOut` of four pointers.
unsafe impl DeviceRepr for QuantizedOut {}

/// A KV cache pool in device memory: per layer, `[block][slot][kv_head][head_dim]` in f16.
#[derive(Debug)]
pub struct CudaKvCache {
    /// Unique among the pools of this process: recordings are kept per pool.
    id: u64,
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

/// Values per scale of the quantized activations (`quantize_q8`), and the width every quantized
/// matrix's rows are a multiple of.
const QUANT_GROUP: usize = 32;

/// A null device pointer, for an absent optional argument.
const NULL: u64 = 0;

impl Backend for CudaBackend {
    type Matrix = CudaMatrix;
    type Vector = CudaVector;
    type Activations = CudaActivations;
    type KvCache = CudaKvCache;
    type Batch = CudaBatch;
    type Recordings = CudaRecordings;

    fn describe(&self) -> String {
        format!("{NAME} ({})", self.device)
    }

    fn peak_bandwidth(&self) -> Option<f64> {
        self.peak_bandwidth
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
        let quantized = if cols.is_multiple_of(QUANT_GROUP) {
            Some(Quantized {
                hi: self.zeros(len, "activations")?,
                lo: self.zeros(len, "activations")?,
                scales: self.zeros(2 * (len / QUANT_GROUP), "activations")?,
                sums: self.zeros(len / 16, "activations")?,
            })
        } else {
            None
        };
        Ok(CudaActivations {
            data: self.zeros(len, "activations")?,
            rows,
            cols,
            quantized,
            quantized_rows: Cell::new(0),
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
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Ok(CudaKvCache {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            layout,
            k,
            v,
        })
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

    fn recordings(&self) -> CudaRecordings {
        CudaRecordings::default()
    }

    fn run_pass<F>(
        &self,
        recordings: &mut CudaRecordings,
        shape: PassShape,
        cache: &mut CudaKvCache,
        enqueue: F,
    ) -> Result<(), Error>
    where
        F: FnOnce(&mut CudaKvCache) -> Result<(), Error>,
    {
        let key = (shape, cache.id);
        if !self.graphs
            || shape.tokens > RECORD_MAX_TOKENS
            || (recordings.graphs.len() >= RECORD_MAX_GRAPHS
                && !recordings.graphs.contains_key(&key))
        {
            return enqueue(cache);
        }
        let graph = match recordings.graphs.entry(key) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                entry.insert(self.record(cache, enqueue)?)
            }
        };
        graph.0.launch().map_err(driver_error("replay"))
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
                    .arg(out.written());
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
        // One warp per 32 columns of each row.
        let groups = x.cols.div_ceil(QUANT_GROUP);
        let items = (rows * groups) as i64;
        let grid = (items as u64).div_ceil(u64::from(WARPS_PER_BLOCK)) as u32;
        let (cols, groups) = (x.cols as i32, groups as i32);
        let (out, quantized) = out.written_quantized(&self.stream, rows);
        self.launch(
            "rms_norm",
            &self.kernels.rms_norm,
            grid,
            WARPS_PER_BLOCK * 32,
            |b| {
                b.arg(&x.data)
                    .arg(&weight.data)
                    .arg(&eps)
                    .arg(&cols)
                    .arg(&groups)
                    .arg(&items)
                    .arg(out)
                    .arg(&quantized);
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
                b.arg(x.written())
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
        // One warp per weight row.
        let grid = (matrix.rows as u32).div_ceil(WARPS_PER_BLOCK);
        let (row_bytes, out_rows, cols, tokens) = (
            matrix.row_bytes as u64,
            matrix.rows as i32,
            matrix.cols as i32,
            rows as i32,
        );
        // The quantized formats take the activations quantized, and have a one-row instance.
        let (mmv, quantized) = match &matrix.format.quantized {
            Some(kernels) => (
                if rows == 1 {
                    &kernels.mmv1
                } else {
                    &matrix.format.mmv
                },
                Some(self.quantize(x, rows)?),
            ),
            None => (&matrix.format.mmv, None),
        };
        self.launch("matmul", mmv, grid, WARPS_PER_BLOCK * 32, |b| {
            b.arg(&matrix.data)
                .arg(&row_bytes)
                .arg(&out_rows)
                .arg(&cols);
            match quantized {
                Some(q) => b.arg(&q.hi).arg(&q.lo).arg(&q.scales).arg(&q.sums),
                None => b.arg(&x.data),
            };
            b.arg(&tokens);
            match bias {
                Some(bias) => b.arg(&bias.data),
                None => b.arg(&NULL),
            };
            b.arg(out.written());
        })
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
            b.arg(x.written())
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
            Some(HEAD_DIMS),
            q.dims(),
            out.dims(),
        )?;
        let rows = batch.host.len();
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
            (rows * shape.heads) as u32,
            ATTENTION_WARPS * 32,
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
                    .arg(out.written());
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
        let (gate, quantized) = gate.written_quantized(&self.stream, rows);
        self.launch(
            "silu_mul",
            &self.kernels.silu_mul,
            elementwise_grid(n),
            ROW_THREADS,
            |b| {
                b.arg(gate).arg(&up.data).arg(&n).arg(&quantized);
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
                b.arg(x.written()).arg(&y.data).arg(&n);
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
                    .arg(out.written());
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
        let mut guard = self.argmax.lock().unwrap_or_else(|e| e.into_inner());
        let best = match &mut *guard {
            Some(best) if best.len() >= out.len() => best,
            slot => slot.insert(self.zeros::<u32>(out.len(), "argmax")?),
        };
        let cols = x.cols as i32;
        self.launch(
            "argmax_rows",
            &self.kernels.argmax_rows,
            out.len() as u32,
            ROW_THREADS,
            |b| {
                b.arg(&x.data).arg(&cols).arg(&mut *best);
            },
        )?;
        self.stream
            .memcpy_dtoh(&best.slice(..out.len()), out)
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
