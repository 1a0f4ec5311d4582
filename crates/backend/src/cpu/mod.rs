//! The CPU backend: weights stay in the memory-mapped file (matrices whose kernels take another
//! layout are also repacked, once, by their first matmul), activations and the KV cache live in
//! host memory, and every operation runs on a fixed pool of threads with SIMD kernels chosen at
//! run time.

mod attention;
mod elementwise;
mod matmul;
mod pool;

use std::sync::{Arc, Mutex, OnceLock};

use half::f16;
use lucebox_gguf::{GgufFile, TensorView};
use lucebox_quant::{ActivationPrecision, Isa, WeightFormat};
use memmap2::MmapMut;

use crate::batch::slot_of;
use crate::checks::{self, Dims};
use crate::{
    ActivationUse, AttentionShape, Backend, BatchCapacity, Error, KvLayout, PassShape, RaggedBatch,
    Rope, RopeStyle, Rows,
};
use pool::{DisjointMut, ThreadPool};

const NAME: &str = "cpu";

/// The CPU backend.
#[derive(Debug)]
pub struct CpuBackend {
    pool: ThreadPool,
    isa: Isa,
    /// The quantized activations of the matmul in progress; grows to the largest matmul seen
    /// and is then reused, so steady-state decoding does not allocate.
    quantized: Mutex<Vec<u8>>,
    /// Attention's per-thread working space, likewise grown once and reused.
    attention_scratch: Mutex<attention::Scratch>,
}

impl CpuBackend {
    /// A backend running on `threads` threads (all cores when `None`), with the best
    /// instruction set this CPU has.
    pub fn new(threads: Option<usize>) -> Result<Self, Error> {
        Self::with_isa(threads, Isa::detect())
    }

    /// A backend restricted to `isa`, which must be available on this CPU.
    pub fn with_isa(threads: Option<usize>, isa: Isa) -> Result<Self, Error> {
        if !isa.is_available() {
            return Err(Error::Unavailable {
                backend: NAME,
                reason: format!("{isa:?} instructions are not available on this CPU"),
            });
        }
        let threads = threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1);
        let pool = ThreadPool::new(threads).map_err(|e| Error::Unavailable {
            backend: NAME,
            reason: format!("cannot start {threads} threads: {e}"),
        })?;
        Ok(Self {
            pool,
            isa,
            quantized: Mutex::new(Vec::new()),
            attention_scratch: Mutex::new(Vec::new()),
        })
    }

    /// The instruction set in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The number of threads that run each operation.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// The tensor `name` of `file`, checked to have `N` dims (ggml order), with its kernels for
    /// activations at `precision`.
    fn tensor<'a, const N: usize>(
        &self,
        op: &'static str,
        file: &'a GgufFile,
        name: &str,
        precision: ActivationPrecision,
    ) -> Result<(TensorView<'a>, [usize; N], WeightFormat), Error> {
        let (view, dims) = checks::tensor::<N>(op, file, name)?;
        let format =
            WeightFormat::with_precision(view.ggml_type(), self.isa, precision).map_err(|_| {
                Error::UnsupportedType {
                    tensor: name.to_owned(),
                    ty: view.ggml_type(),
                    backend: NAME,
                }
            })?;
        Ok((view, dims, format))
    }
}

/// A weight matrix, read in place from the mapped file, and for formats whose kernels take
/// another layout ([`WeightFormat::repacks`]) repacked by its first matmul: an embedding table
/// that is not also the output matrix never is.
#[derive(Debug)]
pub struct CpuMatrix {
    file: Arc<GgufFile>,
    name: String,
    format: WeightFormat,
    rows: usize,
    cols: usize,
    repacked: OnceLock<MmapMut>,
}

impl CpuMatrix {
    /// GGUF's blocks of the matrix.
    fn gguf_bytes(&self) -> &[u8] {
        self.file
            .tensor(&self.name)
            .expect("tensor existed when the matrix was loaded")
            .data()
    }

    /// The matrix as its kernels take it, repacked on the pool's threads the first time.
    fn kernel_bytes(&self, pool: &ThreadPool) -> Result<&[u8], Error> {
        if !self.format.repacks() {
            return Ok(self.gguf_bytes());
        }
        if let Some(repacked) = self.repacked.get() {
            return Ok(repacked);
        }
        let repacked = self.repack(pool)?;
        Ok(self.repacked.get_or_init(|| repacked))
    }

    /// The repacked matrix in fresh anonymous pages: unlike a vector's, they are not filled
    /// with zeros by a pass of their own before the repacking writes them, and they may be huge
    /// pages, a 512th of the faults. A one-token `generate` of Qwen2.5-1.5B took a median 1.0
    /// rather than 1.1 s; half of it is the kernel clearing the 1 GB of fresh pages.
    fn repack(&self, pool: &ThreadPool) -> Result<MmapMut, Error> {
        let row_bytes = self.format.kernel_row_bytes(self.cols);
        let bytes = self.rows * row_bytes;
        let mut repacked = MmapMut::map_anon(bytes).map_err(|_| Error::OutOfMemory {
            what: "repacked weights",
            bytes: bytes as u64,
        })?;
        // Only a hint: without transparent huge pages (or off Linux) the mapping works as well,
        // with small pages.
        #[cfg(target_os = "linux")]
        let _ = repacked.advise(memmap2::Advice::HugePage);
        let gguf = self.gguf_bytes();
        let gguf_row_bytes = gguf.len() / self.rows;
        let out = DisjointMut::new(&mut repacked);
        pool.for_each(self.rows, 64, &|_, rows| {
            // SAFETY: each row is repacked by exactly one range; ranges are disjoint.
            let out = unsafe { out.slice(rows.start * row_bytes..rows.end * row_bytes) };
            let gguf = &gguf[rows.start * gguf_row_bytes..rows.end * gguf_row_bytes];
            self.format.repack_rows_into(gguf, self.cols, out);
        });
        Ok(repacked)
    }
}

/// An f32 vector in host memory.
#[derive(Debug)]
pub struct CpuVector(Vec<f32>);

/// A row-major f32 matrix in host memory.
#[derive(Debug)]
pub struct CpuActivations {
    data: Vec<f32>,
    rows: usize,
    cols: usize,
}

impl CpuActivations {
    fn dims(&self) -> Dims {
        Dims {
            rows: self.rows,
            cols: self.cols,
        }
    }

    fn rows(&self, rows: usize) -> &[f32] {
        &self.data[..rows * self.cols]
    }

    fn rows_mut(&mut self, rows: usize) -> &mut [f32] {
        &mut self.data[..rows * self.cols]
    }
}

/// A KV cache pool in host memory: per layer, `[block][slot][kv_head][head_dim]` in f16.
#[derive(Debug)]
pub struct CpuKvCache {
    layout: KvLayout,
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
}

/// A batch's metadata, with the cosines and sines of every token's rotation.
#[derive(Debug)]
pub struct CpuBatch {
    capacity: BatchCapacity,
    rope: Rope,
    batch: RaggedBatch,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Backend for CpuBackend {
    type Matrix = CpuMatrix;
    type Vector = CpuVector;
    type Activations = CpuActivations;
    type KvCache = CpuKvCache;
    type Batch = CpuBatch;
    /// The CPU has no launch cost to save: passes run as they are issued.
    type Recordings = ();

    fn describe(&self) -> String {
        format!("{NAME} ({:?}, {} threads)", self.isa, self.threads())
    }

    fn peak_bandwidth(&self) -> Option<f64> {
        None
    }

    const ACTIVATION_PRECISIONS: &'static [ActivationPrecision] =
        &[ActivationPrecision::Split, ActivationPrecision::Single];

    fn load_matrix(
        &self,
        file: &Arc<GgufFile>,
        name: &str,
        precision: ActivationPrecision,
        _prompt_rows: bool,
    ) -> Result<CpuMatrix, Error> {
        let (_, [cols, rows], format) = self.tensor("load_matrix", file, name, precision)?;
        Ok(CpuMatrix {
            file: Arc::clone(file),
            name: name.to_owned(),
            format,
            rows,
            cols,
            repacked: OnceLock::new(),
        })
    }

    fn load_vector(&self, file: &Arc<GgufFile>, name: &str) -> Result<CpuVector, Error> {
        let (view, [len], format) =
            self.tensor("load_vector", file, name, ActivationPrecision::Split)?;
        let mut values = vec![0.0; len];
        format.dequantize(view.data(), &mut values);
        Ok(CpuVector(values))
    }

    fn vector_len(&self, v: &CpuVector) -> usize {
        v.0.len()
    }

    fn matrix_shape(&self, m: &CpuMatrix) -> (usize, usize) {
        (m.rows, m.cols)
    }

    /// The CPU quantizes a matmul's input as it multiplies, so every use gets the same buffer.
    fn activations(
        &self,
        rows: usize,
        cols: usize,
        _usage: ActivationUse,
    ) -> Result<CpuActivations, Error> {
        let len = rows.checked_mul(cols).ok_or(Error::OutOfMemory {
            what: "activations",
            bytes: u64::MAX,
        })?;
        Ok(CpuActivations {
            data: try_zeroed(len, "activations")?,
            rows,
            cols,
        })
    }

    fn kv_cache(&self, layout: KvLayout) -> Result<CpuKvCache, Error> {
        let per_layer = layout.layer_len().ok_or(Error::OutOfMemory {
            what: "kv cache",
            bytes: u64::MAX,
        })?;
        let layer = || try_filled(per_layer, f16::ZERO, "kv cache");
        let k = (0..layout.layers)
            .map(|_| layer())
            .collect::<Result<_, _>>()?;
        let v = (0..layout.layers)
            .map(|_| layer())
            .collect::<Result<_, _>>()?;
        Ok(CpuKvCache { layout, k, v })
    }

    fn batch(
        &self,
        capacity: BatchCapacity,
        rope: Rope,
        _: AttentionShape,
    ) -> Result<CpuBatch, Error> {
        let half_rot = rope.rotary_dims / 2;
        let mut batch = RaggedBatch::new();
        batch.tokens.reserve(capacity.tokens);
        batch.positions.reserve(capacity.tokens);
        batch.token_seq.reserve(capacity.tokens);
        batch.logits_rows.reserve(capacity.logits);
        batch.seqs.reserve(capacity.sequences);
        batch.block_ids.reserve(capacity.blocks);
        Ok(CpuBatch {
            capacity,
            rope,
            batch,
            cos: try_zeroed(capacity.tokens * half_rot, "rope table")?,
            sin: try_zeroed(capacity.tokens * half_rot, "rope table")?,
        })
    }

    fn set_batch(&self, dst: &mut CpuBatch, src: &RaggedBatch) -> Result<u32, Error> {
        checks::set_batch(src, dst.capacity)?;
        dst.batch.copy_from(src);
        dst.rope.tables(src.positions(), &mut dst.cos, &mut dst.sin);
        Ok(0)
    }

    fn recordings(&self) {}

    fn run_pass<F>(
        &self,
        _recordings: &mut (),
        _shape: PassShape,
        cache: &mut CpuKvCache,
        enqueue: F,
    ) -> Result<(), Error>
    where
        F: FnOnce(&mut CpuKvCache) -> Result<(), Error>,
    {
        enqueue(cache)
    }

    fn embed(
        &self,
        table: &CpuMatrix,
        batch: &CpuBatch,
        out: &mut CpuActivations,
    ) -> Result<(), Error> {
        checks::embed(&batch.batch, (table.rows, table.cols), out.dims())?;
        let tokens = batch.batch.tokens();
        let bytes = table.gguf_bytes();
        let (cols, row_bytes) = (table.cols, bytes.len() / table.rows);
        for (&token, row) in tokens.iter().zip(out.data.chunks_exact_mut(cols)) {
            let token = token as usize;
            let gguf_row = &bytes[token * row_bytes..(token + 1) * row_bytes];
            table.format.dequantize(gguf_row, row);
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &CpuActivations,
        weight: &CpuVector,
        eps: f32,
        rows: usize,
        out: &mut CpuActivations,
    ) -> Result<(), Error> {
        checks::rms_norm(rows, x.dims(), weight.0.len(), out.dims())?;
        for (src, dst) in x
            .rows(rows)
            .chunks_exact(x.cols)
            .zip(out.rows_mut(rows).chunks_exact_mut(x.cols))
        {
            elementwise::rms_norm(src, &weight.0, eps, dst);
        }
        Ok(())
    }

    fn rms_norm_heads(
        &self,
        x: &mut CpuActivations,
        weight: &CpuVector,
        eps: f32,
        rows: usize,
    ) -> Result<(), Error> {
        let head_dim = weight.0.len();
        checks::rms_norm_heads(rows, x.dims(), head_dim)?;
        for head in x.rows_mut(rows).chunks_exact_mut(head_dim) {
            elementwise::rms_norm_in_place(head, &weight.0, eps);
        }
        Ok(())
    }

    fn matmul(
        &self,
        matrix: &CpuMatrix,
        bias: Option<&CpuVector>,
        x: &CpuActivations,
        rows: Rows,
        out: &mut CpuActivations,
    ) -> Result<(), Error> {
        // Prompt rows and the others get the same arithmetic here.
        checks::matmul(
            rows,
            (matrix.rows, matrix.cols),
            bias.map(|b| b.0.len()),
            x.dims(),
            out.dims(),
        )?;
        let rows = rows.total;
        let mut quantized = self.quantized.lock().unwrap_or_else(|e| e.into_inner());
        matmul::matmul(
            &self.pool,
            matrix,
            bias.map(|b| &b.0[..]),
            x.rows(rows),
            rows,
            out.rows_mut(rows),
            &mut quantized,
        )
    }

    fn rope(&self, x: &mut CpuActivations, batch: &CpuBatch, head_dim: usize) -> Result<(), Error> {
        checks::rope(&batch.batch, x.dims(), head_dim, batch.rope.rotary_dims)?;
        let rows = batch.batch.len();
        let half_rot = batch.rope.rotary_dims / 2;
        let cols = x.cols;
        for (t, row) in x.rows_mut(rows).chunks_exact_mut(cols).enumerate() {
            let cos = &batch.cos[t * half_rot..(t + 1) * half_rot];
            let sin = &batch.sin[t * half_rot..(t + 1) * half_rot];
            for head in row.chunks_exact_mut(head_dim) {
                match batch.rope.style {
                    RopeStyle::Adjacent => elementwise::rotate_adjacent(head, cos, sin),
                    RopeStyle::Neox => elementwise::rotate_neox(head, cos, sin),
                }
            }
        }
        Ok(())
    }

    fn store_kv(
        &self,
        cache: &mut CpuKvCache,
        layer: usize,
        k: &CpuActivations,
        v: &CpuActivations,
        batch: &CpuBatch,
    ) -> Result<(), Error> {
        let l = cache.layout;
        checks::store_kv(&l, layer, &batch.batch, k.dims(), v.dims())?;
        let width = l.kv_heads * l.head_dim;
        let rows = batch.batch.len();
        for t in 0..rows {
            let slot = slot_of(&batch.batch, &l, t);
            let dst = slot * width..(slot + 1) * width;
            let src = t * width..(t + 1) * width;
            elementwise::to_f16(&k.data[src.clone()], &mut cache.k[layer][dst.clone()]);
            elementwise::to_f16(&v.data[src], &mut cache.v[layer][dst]);
        }
        Ok(())
    }

    fn attention(
        &self,
        q: &CpuActivations,
        cache: &CpuKvCache,
        layer: usize,
        batch: &CpuBatch,
        shape: AttentionShape,
        out: &mut CpuActivations,
    ) -> Result<(), Error> {
        let l = cache.layout;
        checks::attention(&l, layer, &batch.batch, shape, None, q.dims(), out.dims())?;
        let rows = batch.batch.len();
        let mut scratch = self
            .attention_scratch
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        attention::attention(
            &self.pool,
            &mut scratch,
            q.rows(rows),
            &cache.k[layer],
            &cache.v[layer],
            &l,
            &batch.batch,
            shape,
            out.rows_mut(rows),
        );
        Ok(())
    }

    fn silu_mul(
        &self,
        gate: &mut CpuActivations,
        up: &CpuActivations,
        rows: usize,
    ) -> Result<(), Error> {
        checks::elementwise("silu_mul", rows, gate.dims(), up.dims())?;
        elementwise::silu_mul(gate.rows_mut(rows), up.rows(rows));
        Ok(())
    }

    fn add(&self, x: &mut CpuActivations, y: &CpuActivations, rows: usize) -> Result<(), Error> {
        checks::elementwise("add", rows, x.dims(), y.dims())?;
        for (a, b) in x.rows_mut(rows).iter_mut().zip(y.rows(rows)) {
            *a += b;
        }
        Ok(())
    }

    fn gather_logits_rows(
        &self,
        x: &CpuActivations,
        batch: &CpuBatch,
        out: &mut CpuActivations,
    ) -> Result<(), Error> {
        checks::gather_logits_rows(&batch.batch, x.dims(), out.dims())?;
        let wanted = batch.batch.logits_rows();
        let cols = x.cols;
        for (i, &row) in wanted.iter().enumerate() {
            let row = row as usize;
            out.data[i * cols..(i + 1) * cols]
                .copy_from_slice(&x.data[row * cols..(row + 1) * cols]);
        }
        Ok(())
    }

    fn read_rows(&self, x: &CpuActivations, rows: usize, out: &mut [f32]) -> Result<(), Error> {
        checks::read_rows(rows, x.dims(), out.len())?;
        out.copy_from_slice(x.rows(rows));
        Ok(())
    }

    fn argmax_rows(&self, x: &CpuActivations, out: &mut [u32]) -> Result<(), Error> {
        checks::rows("argmax_rows", out.len(), x.rows)?;
        for (row, best) in x.rows(out.len()).chunks_exact(x.cols).zip(out.iter_mut()) {
            *best = crate::argmax(row);
        }
        Ok(())
    }
}

fn try_filled<T: Clone>(len: usize, value: T, what: &'static str) -> Result<Vec<T>, Error> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::OutOfMemory {
        what,
        bytes: (len * size_of::<T>()) as u64,
    })?;
    v.resize(len, value);
    Ok(v)
}

fn try_zeroed(len: usize, what: &'static str) -> Result<Vec<f32>, Error> {
    try_filled(len, 0.0, what)
}
