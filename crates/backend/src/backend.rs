use std::sync::Arc;

use lucebox_gguf::GgufFile;
use lucebox_quant::ActivationPrecision;

use crate::{Error, RaggedBatch, TokenRole};

/// How one logits row becomes a token where the logits are ([`Backend::sample_rows`]): the
/// transforms of the engine's sampler, in its order (penalties, temperature, top-k, top-p,
/// min-p), then a draw with `uniform` that walks the surviving tokens in id order.
#[derive(Clone, Debug, PartialEq)]
pub struct RowSampling {
    /// The logits row.
    pub row: usize,
    /// Softmax temperature; 0 takes the most likely token after the penalties.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the most likely tokens whose probabilities reach `top_p`; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one.
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of the penalised tokens.
    pub repetition_penalty: f32,
    /// Subtracted from the logits of the penalised tokens.
    pub presence_penalty: f32,
    /// Subtracted, times its count, from each penalised token's logit.
    pub frequency_penalty: f32,
    /// This row's `(token, count)` pairs in the call's list: distinct tokens.
    pub penalised: std::ops::Range<usize>,
    /// A uniform number in [0, 1) for the draw (unused when greedy).
    pub uniform: f64,
}

/// The index of the largest value: the first one on ties, and NaN never wins (0 for a row of
/// NaNs). Every backend's [`Backend::argmax_rows`] gives exactly this, so that greedy decoding
/// picks the same token whether it runs on the device or on the host.
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    let mut best_value = f32::NEG_INFINITY;
    for (i, &v) in row.iter().enumerate() {
        if v > best_value {
            best = i;
            best_value = v;
        }
    }
    best as u32
}

/// How rotary position embeddings pair up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)`: llama.cpp's "normal" RoPE, used by `llama` models whose
    /// converter permuted the Q and K weights.
    Adjacent,
    /// Pairs `(i, i + n_rot/2)`: the GPT-NeoX layout, used by `qwen2` and `qwen3`.
    Neox,
}

/// The rotary position embedding of a model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// How dimensions are paired.
    pub style: RopeStyle,
    /// How many leading dimensions of each head rotate (the rest pass through).
    pub rotary_dims: usize,
    /// The base of the frequencies, `theta_i = position * base^(-2i / rotary_dims)`.
    pub freq_base: f64,
    /// Linear position scaling: positions are multiplied by this factor (1 when unscaled).
    pub position_scale: f64,
}

impl Rope {
    /// Fills the per-token cosine and sine tables for `positions` (`rotary_dims / 2` of each
    /// per token), computing angles in f64 so that long positions keep full f32 precision.
    /// Every backend rotates with these same values.
    pub(crate) fn tables(&self, positions: &[u32], cos: &mut [f32], sin: &mut [f32]) {
        let half = self.rotary_dims / 2;
        for (t, &pos) in positions.iter().enumerate() {
            let p = f64::from(pos) * self.position_scale;
            for i in 0..half {
                let inv_freq = self
                    .freq_base
                    .powf(-2.0 * i as f64 / self.rotary_dims as f64);
                let (s, c) = (p * inv_freq).sin_cos();
                cos[t * half + i] = c as f32;
                sin[t * half + i] = s as f32;
            }
        }
    }
}

/// The shape of one model's KV cache pool: `blocks` blocks of `block_tokens` positions, for
/// every layer, holding K and V in f16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Transformer layers.
    pub layers: usize,
    /// Blocks in the pool, shared by all sequences.
    pub blocks: usize,
    /// Positions per block.
    pub block_tokens: usize,
    /// KV heads per layer.
    pub kv_heads: usize,
    /// Dimensions per head.
    pub head_dim: usize,
}

impl KvLayout {
    /// Values of K (or of V) per layer, or `None` when that overflows: what a backend allocates
    /// for each layer, twice.
    pub(crate) fn layer_len(&self) -> Option<usize> {
        [self.blocks, self.block_tokens, self.kv_heads]
            .into_iter()
            .try_fold(self.head_dim, usize::checked_mul)
    }

    /// Bytes the pool takes (K and V, f16).
    pub fn bytes(&self) -> u64 {
        2 * 2
            * (self.layers * self.blocks * self.block_tokens * self.kv_heads * self.head_dim) as u64
    }
}

/// The most a prepared batch can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchCapacity {
    /// Tokens per forward pass.
    pub tokens: usize,
    /// Sequences per forward pass.
    pub sequences: usize,
    /// Block-table entries per forward pass, summed over its sequences.
    pub blocks: usize,
    /// Tokens per forward pass whose logits are wanted.
    pub logits: usize,
}

/// What one forward pass's sequence of operations depends on, besides the buffers it runs on:
/// two passes of the same shape over the same model, workspace and KV cache issue the same
/// operations, their batches differing only in what [`Backend::set_batch`] copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PassShape {
    /// The model's unique id.
    pub model: u64,
    /// Tokens in the batch.
    pub tokens: usize,
    /// Tokens whose logits are kept.
    pub logits: usize,
    /// The leading tokens that are prompt tokens ([`RaggedBatch::prompt_tokens`]).
    pub prompt: usize,
    /// What else the backend's launches depend on in the batch, as
    /// [`Backend::set_batch`] returned it.
    pub variant: u32,
}

/// The head geometry of attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    /// Query heads.
    pub heads: usize,
    /// KV heads; each serves `heads / kv_heads` query heads.
    pub kv_heads: usize,
    /// Dimensions per head.
    pub head_dim: usize,
    /// The factor applied to `q . k`, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
}

/// The activation rows a matmul multiplies: the first `total` of its input, of which the first
/// `prompt` are prompt tokens' ([`RaggedBatch::prompt_tokens`]).
///
/// A backend may multiply prompt rows another way than the others, with other rounding (the
/// GPU's f16 GEMM, where its host profile's `prompt_gemm` asks for it): each way gives a row
/// the same bits in any pass, so a token's results depend on its role, never on its batch or
/// on how its prompt was cut into passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rows {
    /// Rows multiplied.
    pub total: usize,
    /// The leading ones that are prompt tokens' (at most `total`).
    pub prompt: usize,
}

impl Rows {
    /// `total` rows, none of them a prompt token's (logits rows, decode steps).
    pub fn generated(total: usize) -> Self {
        Self { total, prompt: 0 }
    }
}

/// What reads an activation matrix, so that a backend gives it only the copies its readers take
/// (the GPU's quantized copy and scratch for its int8 matmuls, its f16 copy for the GEMM of
/// prompt rows: for a 576-row logits buffer of a 151,936-token vocabulary, 175 MB each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActivationUse {
    /// No matmul: the residual stream, q, k and v, a product, the logits.
    Plain,
    /// The input of matmuls.
    MatmulInput {
        /// Whether any of their rows are prompt tokens' ([`Rows::prompt`]), as a layer's
        /// projections' are and the output head's are not.
        prompt_rows: bool,
        /// The precision their matrices were loaded at, which a device backend quantizes the
        /// activations at as it writes them.
        precision: ActivationPrecision,
    },
}

/// One product of [`Backend::matmuls`]: `out = x . matrix^T (+ bias)`.
pub struct Projection<'a, B: Backend + ?Sized> {
    /// The weights.
    pub matrix: &'a B::Matrix,
    /// Added to each output row, if any.
    pub bias: Option<&'a B::Vector>,
    /// Where the product goes.
    pub out: &'a mut B::Activations,
}

impl<B: Backend + ?Sized> std::fmt::Debug for Projection<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Projection")
            .field("bias", &self.bias.is_some())
            .finish_non_exhaustive()
    }
}

/// A compute device: it owns weights, activations and the KV cache in its own memory, and runs
/// the operations of a forward pass over a [`RaggedBatch`].
///
/// Everything above this trait is device-agnostic: a model is a sequence of these calls, and no
/// caller touches device memory except through [`read_rows`](Backend::read_rows) and
/// [`argmax_rows`](Backend::argmax_rows), which are the only points where the host waits for
/// the device. Operations may run asynchronously in issue order. Batch metadata reaches the
/// device only through [`set_batch`](Backend::set_batch), into a buffer of fixed capacity, so a
/// device backend can capture one forward pass of a given batch shape as a graph and replay it
/// after each `set_batch`.
///
/// Activations are row-major f32 matrices of fixed capacity; operations name how many rows they
/// cover. Matrices are weights `[rows = outputs, cols = inputs]` in the file's storage format.
pub trait Backend: Send + Sync + 'static {
    /// A weight matrix on the device, in its storage format.
    type Matrix: Send + Sync;
    /// An f32 vector on the device (norm weights, biases).
    type Vector: Send + Sync;
    /// An f32 activation matrix on the device.
    type Activations: Send;
    /// A KV cache pool on the device.
    type KvCache: Send;
    /// A batch's metadata on the device, with its per-token rotary tables.
    type Batch: Send;
    /// The forward passes recorded for one workspace (see [`run_pass`](Backend::run_pass)).
    type Recordings: Send;

    /// A short description, such as `cpu (avx512, 2 threads)`.
    fn describe(&self) -> String;
    /// The peak bandwidth of the memory the weights live in, in bytes per second, as the
    /// device's driver reports it; `None` where there is no such figure (the CPU).
    fn peak_bandwidth(&self) -> Option<f64>;

    /// The activation precisions [`load_matrix`](Backend::load_matrix) takes, the most exact
    /// first.
    const ACTIVATION_PRECISIONS: &'static [ActivationPrecision];

    /// Makes the 2-D tensor `name` of `file` a matrix on the device, whose matmuls quantize
    /// their activations at `precision` (one of [`ACTIVATION_PRECISIONS`](Self::ACTIVATION_PRECISIONS),
    /// else [`Error::UnsupportedPrecision`]). `prompt_rows` says whether its matmuls are given
    /// prompt rows ([`Rows::prompt`]): a backend that multiplies them another way prepares
    /// that (the GPU: room to dequantize it to f16) for such matrices only.
    fn load_matrix(
        &self,
        file: &Arc<GgufFile>,
        name: &str,
        precision: ActivationPrecision,
        prompt_rows: bool,
    ) -> Result<Self::Matrix, Error>;
    /// Makes the 1-D tensor `name` of `file` an f32 vector on the device.
    fn load_vector(&self, file: &Arc<GgufFile>, name: &str) -> Result<Self::Vector, Error>;
    /// The length of a vector.
    fn vector_len(&self, v: &Self::Vector) -> usize;
    /// The (rows, cols) of a matrix.
    fn matrix_shape(&self, m: &Self::Matrix) -> (usize, usize);

    /// An activation matrix of up to `rows` rows of `cols` values, read as `usage` says.
    fn activations(
        &self,
        rows: usize,
        cols: usize,
        usage: ActivationUse,
    ) -> Result<Self::Activations, Error>;
    /// A KV cache pool.
    fn kv_cache(&self, layout: KvLayout) -> Result<Self::KvCache, Error>;
    /// A batch buffer of the given capacity for a model with the given rotary embedding and
    /// attention (whose scratch, where a backend needs some, the batch holds).
    fn batch(
        &self,
        capacity: BatchCapacity,
        rope: Rope,
        attention: AttentionShape,
    ) -> Result<Self::Batch, Error>;
    /// Copies a batch description to the device. Fails if it exceeds the buffer's capacity.
    /// Returns what the backend's launches for the batch depend on besides its size (the GPU's
    /// attention: how many blocks share a head, and how many warps a block runs), for
    /// [`PassShape::variant`]; 0 where nothing does.
    fn set_batch(&self, dst: &mut Self::Batch, src: &RaggedBatch) -> Result<u32, Error>;

    /// An empty set of recorded forward passes.
    fn recordings(&self) -> Self::Recordings;
    /// Queues one forward pass of `shape` over `cache`, whose operations `enqueue` issues.
    ///
    /// A device backend may record what `enqueue` issues the first time it sees `shape` with
    /// `cache` and `recordings`, and afterwards replay the recording instead of calling
    /// `enqueue`: one launch instead of hundreds. So `enqueue` must issue the same operations on
    /// the same buffers whenever the shape is the same, every per-batch value reaching the
    /// device through [`set_batch`](Backend::set_batch), and the buffers must outlive
    /// `recordings`. The host-side checks of the operations run when a pass is recorded; the
    /// caller validates each batch's contents.
    fn run_pass<F>(
        &self,
        recordings: &mut Self::Recordings,
        shape: PassShape,
        cache: &mut Self::KvCache,
        enqueue: F,
    ) -> Result<(), Error>
    where
        F: FnOnce(&mut Self::KvCache) -> Result<(), Error>;

    /// The shortest prompt whose tokens' rows get other arithmetic than the others, in their
    /// matmuls ([`Rows`]) or their attention (the leading [`RaggedBatch::prompt_tokens`] rows),
    /// or `None` where no row does. Where they do, a position's KV depends on its token's role,
    /// which the engine then keeps whenever it computes a position again or shares it between
    /// sequences; a shorter prompt's tokens are fed as [`TokenRole::Generated`]
    /// ([`prompt_role`](Backend::prompt_role)), since the prompt kernels' fixed cost (the GPU
    /// dequantizes every layer matrix for its GEMM) outweighs what they save on few rows.
    fn prompt_rows_from(&self) -> Option<usize> {
        None
    }

    /// The role in which a prompt of `len` tokens is fed: [`TokenRole::Prompt`] unless the
    /// backend computes prompt rows apart only from a longer prompt
    /// ([`prompt_rows_from`](Backend::prompt_rows_from)). A role that depends on the whole
    /// prompt, never on how it is cut into passes, keeps a token's bits independent of its
    /// batch.
    fn prompt_role(&self, len: usize) -> TokenRole {
        match self.prompt_rows_from() {
            Some(from) if len < from => TokenRole::Generated,
            _ => TokenRole::Prompt,
        }
    }

    /// How many passes [`run_pass`](Backend::run_pass) has recorded so far. A pass that
    /// recorded took longer than its replays will, so callers that time passes to choose what
    /// to run next (the speculative draft length) leave such a pass out.
    fn passes_recorded(&self) -> u64 {
        0
    }

    /// Returns once every operation issued so far has run. A device backend queues its work
    /// and returns at once; reading a result waits for it. Callers that time work whose
    /// results they do not read (a drafter catching up) wait here, so that its time is not
    /// counted in whatever reads a result next. The CPU backend runs its work as it is issued.
    fn synchronize(&self) -> Result<(), Error> {
        Ok(())
    }

    /// `out[t] = table[token t]` for every token of the batch.
    fn embed(
        &self,
        table: &Self::Matrix,
        batch: &Self::Batch,
        out: &mut Self::Activations,
    ) -> Result<(), Error>;
    /// RMS normalisation of `rows` rows: `out = x / rms(x) * weight`.
    fn rms_norm(
        &self,
        x: &Self::Activations,
        weight: &Self::Vector,
        eps: f32,
        rows: usize,
        out: &mut Self::Activations,
    ) -> Result<(), Error>;
    /// `x += y`, then `out = x / rms(x) * weight`, for `rows` rows: the residual add that ends
    /// a sublayer and the norm that starts the next, which a device backend runs as one kernel.
    fn add_rms_norm(
        &self,
        x: &mut Self::Activations,
        y: &Self::Activations,
        weight: &Self::Vector,
        eps: f32,
        rows: usize,
        out: &mut Self::Activations,
    ) -> Result<(), Error> {
        self.add(x, y, rows)?;
        self.rms_norm(x, weight, eps, rows, out)
    }
    /// RMS normalisation in place of each head of `rows` rows, each row holding
    /// `cols / weight.len()` heads (the q/k norms of `qwen3`).
    fn rms_norm_heads(
        &self,
        x: &mut Self::Activations,
        weight: &Self::Vector,
        eps: f32,
        rows: usize,
    ) -> Result<(), Error>;
    /// `out = x . matrix^T (+ bias)` for `rows.total` rows.
    fn matmul(
        &self,
        matrix: &Self::Matrix,
        bias: Option<&Self::Vector>,
        x: &Self::Activations,
        rows: Rows,
        out: &mut Self::Activations,
    ) -> Result<(), Error>;
    /// [`matmul`](Backend::matmul) of each projection with the same `x`: a layer's q, k and v,
    /// or its gate and up, which a device backend runs as one kernel where their formats agree.
    fn matmuls(
        &self,
        x: &Self::Activations,
        rows: Rows,
        projections: &mut [Projection<'_, Self>],
    ) -> Result<(), Error> {
        for p in projections {
            self.matmul(p.matrix, p.bias, x, rows, p.out)?;
        }
        Ok(())
    }
    /// Rotates each head of each batch row in place by its token's position.
    fn rope(
        &self,
        x: &mut Self::Activations,
        batch: &Self::Batch,
        head_dim: usize,
    ) -> Result<(), Error>;
    /// Writes the batch's K and V rows into their sequences' slots of `layer`.
    fn store_kv(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        k: &Self::Activations,
        v: &Self::Activations,
        batch: &Self::Batch,
    ) -> Result<(), Error>;
    /// [`rope`](Backend::rope) on `q` and on `k`, then [`store_kv`](Backend::store_kv) of `k`
    /// and `v`: what each layer does between its projections and attention, which a device
    /// backend runs as one kernel.
    #[allow(clippy::too_many_arguments)]
    fn rope_store_kv(
        &self,
        q: &mut Self::Activations,
        k: &mut Self::Activations,
        v: &Self::Activations,
        cache: &mut Self::KvCache,
        layer: usize,
        batch: &Self::Batch,
        head_dim: usize,
    ) -> Result<(), Error> {
        self.rope(q, batch, head_dim)?;
        self.rope(k, batch, head_dim)?;
        self.store_kv(cache, layer, k, v, batch)
    }
    /// Causal attention of each batch row's queries over its sequence's KV at positions
    /// `0..=position`; the batch's prompt rows may take other arithmetic
    /// ([`prompt_rows_from`](Backend::prompt_rows_from)).
    fn attention(
        &self,
        q: &Self::Activations,
        cache: &Self::KvCache,
        layer: usize,
        batch: &Self::Batch,
        shape: AttentionShape,
        out: &mut Self::Activations,
    ) -> Result<(), Error>;
    /// [`rope_store_kv`](Backend::rope_store_kv) with `shape.head_dim`, then
    /// [`attention`](Backend::attention) into `out`: a layer's work from its q, k and v
    /// projections to its output projection's input. A device backend does it in one kernel
    /// for a pass where each sequence has one token (a decode step), leaving `q` and `k`
    /// unrotated: after it, only the cache and `out` hold its results.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        q: &mut Self::Activations,
        k: &mut Self::Activations,
        v: &Self::Activations,
        cache: &mut Self::KvCache,
        layer: usize,
        batch: &Self::Batch,
        shape: AttentionShape,
        out: &mut Self::Activations,
    ) -> Result<(), Error> {
        self.rope_store_kv(q, k, v, cache, layer, batch, shape.head_dim)?;
        self.attention(q, cache, layer, batch, shape, out)
    }
    /// `gate = silu(gate) * up` for `rows` rows.
    fn silu_mul(
        &self,
        gate: &mut Self::Activations,
        up: &Self::Activations,
        rows: usize,
    ) -> Result<(), Error>;
    /// `x += y` for `rows` rows.
    fn add(
        &self,
        x: &mut Self::Activations,
        y: &Self::Activations,
        rows: usize,
    ) -> Result<(), Error>;
    /// `out[i] = x[batch.logits_rows()[i]]`: keeps the rows whose logits are wanted.
    fn gather_logits_rows(
        &self,
        x: &Self::Activations,
        batch: &Self::Batch,
        out: &mut Self::Activations,
    ) -> Result<(), Error>;

    /// Copies `rows` rows to the host; `out.len()` must be `rows * cols`.
    fn read_rows(&self, x: &Self::Activations, rows: usize, out: &mut [f32]) -> Result<(), Error>;
    /// The [`argmax`] of each of `out.len()` rows.
    fn argmax_rows(&self, x: &Self::Activations, out: &mut [u32]) -> Result<(), Error>;

    /// Whether [`sample_rows`](Backend::sample_rows) draws tokens where the logits are. Where
    /// it does not, callers copy the rows to the host ([`read_rows`](Backend::read_rows)) and
    /// sample there.
    fn samples_rows(&self) -> bool {
        false
    }
    /// Draws the token of each of `rows` from its logits row of `x` into `out` (one per entry
    /// of `rows`), the penalised tokens' pairs being `penalised[rows[i].penalised]`; the rows
    /// are left penalised. `None` where the row's surviving tokens are too many for the
    /// device's sampler: the caller samples that row itself. Backends whose
    /// [`samples_rows`](Backend::samples_rows) is false return [`Error::NotSupported`].
    fn sample_rows(
        &self,
        x: &mut Self::Activations,
        rows: &[RowSampling],
        penalised: &[(u32, u32)],
        out: &mut [Option<u32>],
    ) -> Result<(), Error> {
        let _ = (x, rows, penalised, out);
        Err(Error::NotSupported { op: "sample_rows" })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_kv_pool_too_large_to_count_is_an_error_not_a_panic() {
        use crate::{Backend, CpuBackend, Error, KvLayout};
        let layout = KvLayout {
            layers: 1,
            blocks: usize::MAX / 2,
            block_tokens: 16,
            kv_heads: 2,
            head_dim: 64,
        };
        assert_eq!(layout.layer_len(), None);
        let cpu = CpuBackend::new(Some(1)).unwrap();
        assert!(matches!(
            cpu.kv_cache(layout),
            Err(Error::OutOfMemory {
                what: "kv cache",
                ..
            })
        ));
    }

    #[test]
    fn argmax_takes_the_first_maximum_and_never_nan() {
        assert_eq!(super::argmax(&[1.0, f32::NAN, 3.0, 3.0]), 2);
        assert_eq!(super::argmax(&[f32::NAN, f32::NAN]), 0);
    }
}
