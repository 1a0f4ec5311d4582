//! The GPU backend, one implementation for every [`Runtime`]: weights uploaded once in their
//! GGUF block layout, activations and the paged f16 KV cache in device memory, the kernels of
//! `kernels/cuda/` (one source for CUDA and HIP), and short forward passes recorded as graphs.
//!
//! The runtimes ([`Cuda`](crate::Cuda), [`Hip`](crate::Hip)) differ only in how they allocate,
//! copy, launch and record; everything the kernels are told (grids, arguments, checks) is here,
//! once.

mod kernels;
mod runtime;
mod sample;

use std::cell::Cell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lucebox_gguf::{GgmlType, GgufFile};
use lucebox_quant::{ActivationPrecision, Isa, WeightFormat};

use crate::checks::{self, Dims, HeadDims};
use crate::{
    ActivationUse, AttentionShape, Backend, BatchCapacity, Error, GpuTuning, KvLayout, PassShape,
    Projection, RaggedBatch, Rope, RopeStyle, Rows,
};
pub(crate) use kernels::Kernels;
use kernels::{
    FormatKernels, GEMM_TILES, MMQ_TILE_ROWS, PerHeadDim, PromptGemm, Streamed, StreamedMixed,
};
pub(crate) use runtime::Sealed;
pub use runtime::{KernelArg, QuantizedOut, Runtime};

/// Threads per block of the row-wise kernels.
const ROW_THREADS: u32 = 256;
/// The most threads of a `rope_store_kv` block (one per rotated pair of a token's q and k).
const ROPE_STORE_MAX_THREADS: u32 = 1024;
/// The columns of a row that each block of `argmax_rows` takes: its [`ROW_THREADS`] threads
/// read 16 each (ARGMAX_CHUNK in kernels/cuda/argmax.cu).
const ARGMAX_CHUNK: usize = 4096;
/// Lanes per warp (CUDA) or wave (HIP): the kernels reduce over 32 lanes, and the HIP build
/// refuses wave64 (kernels/portable.cuh).
const LANES: u32 = 32;
/// Warps per block of the small kernels that give each warp one item (a group of 32 values to
/// quantize, a head to normalise).
const WARPS_PER_BLOCK: u32 = 4;
/// The heads the attention kernels take, one kernel per length (`attention_<head_dim>`): each
/// lane holds head_dim / 32 dimensions.
const HEAD_DIMS: HeadDims = HeadDims {
    max: 256,
    multiple_of: 32,
};
/// The grouped attention kernels' instances (`attention_<head_dim>_x<group>`,
/// kernels/cuda/attention.cu): blocks of `group` query heads of one KV head, whose softmax
/// states more heads would spill from registers.
const GROUPED_ATTENTION: GroupedInstances = GroupedInstances {
    head_dims: &[64, 128],
    groups: &[2, 3, 4],
};

/// The (head length, group) pairs of the grouped attention kernels: every combination.
struct GroupedInstances {
    head_dims: &'static [usize],
    groups: &'static [u32],
}

/// The heads prompt rows' attention on the tensor cores takes (`prompt_attention_<head_dim>`,
/// kernels/cuda/prompt_attention.cu): wider heads' accumulators would not fit a thread's
/// registers, and their prompt rows take `attention_<head_dim>` like every other row.
const PROMPT_ATTENTION_HEAD_DIMS: HeadDims = HeadDims {
    max: 128,
    multiple_of: 32,
};
/// Query rows per block of prompt rows' attention (`PROMPT_ATTENTION_ROWS`), 16 a warp.
const PROMPT_ATTENTION_ROWS: usize = 64;
/// Threads per block of prompt rows' attention (`PROMPT_ATTENTION_WARPS` warps).
const PROMPT_ATTENTION_THREADS: u32 = 4 * LANES;
/// The most ranges attention cuts a token's positions into (`ATTENTION_SPLITS` in
/// `kernels/cuda/attention.cu`): in a pass of up to [`SPLIT_BLOCKS_MAX_TOKENS`] tokens each
/// range of a head has its own block, so that a long sequence's K and V stream through as many
/// SMs; a longer pass, which fills the GPU with one block per head, takes them in turn, with
/// the same arithmetic.
const ATTENTION_SPLITS: u32 = 8;
/// The longest pass whose attention gives each range its own block.
const SPLIT_BLOCKS_MAX_TOKENS: usize = 8;

/// How many ranges attention cuts the positions `0..=position` into with `warps` warps per
/// block: ranges of an eighth of the tiles of 32 positions, rounded up to a multiple of the
/// warps (`range_tiles` in `kernels/cuda/attention.cu`).
fn attention_ranges(position: u32, warps: u32) -> u32 {
    let tiles = position / LANES + 1;
    let per_range = tiles.div_ceil(ATTENTION_SPLITS).div_ceil(warps) * warps;
    tiles.div_ceil(per_range)
}
/// Warps per block of the row norm (`NORM_WARPS`), one block per row.
const NORM_WARPS: u32 = 32;
/// The widest row the norm takes (`NORM_MAX_COLS`): each thread keeps eight of its values in
/// registers.
const NORM_MAX_COLS: usize = 8 * (NORM_WARPS * LANES) as usize;
/// The largest forward pass recorded as a graph: decode and verify steps, whose hundreds of
/// short kernels cost more to launch one by one than to run. Longer prefill passes are
/// dominated by their matrix products.
const RECORD_MAX_TOKENS: usize = 64;
/// Forward passes of at most this many tokens let each kernel start while the one before it
/// finishes, where the runtime can (CUDA on sm_90 and later: `Runtime::launch`). Measured on the
/// H200 with the 1.5B model against launches in turn: decode of one sequence 5-7% faster (the
/// 0.5B 11%), of 2 and 4 sequences 3% and 1%, n-gram speculation 3-4%; but 8, 12 and 16
/// sequences 1%, 4% and 5% slower, and 64 about 1%, with or without the matvec's prefetch.
/// Passes on the streamed matmul's tiles do not overlap at any length (`overlapping`).
const OVERLAP_MAX_TOKENS: usize = 4;
/// The most graphs one workspace keeps (one per batch shape seen).
const RECORD_MAX_GRAPHS: usize = 256;
/// Values per scale of the quantized activations (`quantize_q8`), and the width every quantized
/// matrix's rows are a multiple of.
const QUANT_GROUP: usize = 32;
/// The most matrices one quantized matvec launch takes (`MatvecPart`s of kernels/cuda/mmv.cu).
const MATVEC_PARTS: usize = 3;
/// The most activation rows of the four-row matvec instance.
const MATVEC_FUSED_ROWS: usize = 4;
/// A quantized row of more spans of [`QUANT_GROUP`] columns than this (2,048 columns: the 1.5B's
/// down projection has 8,960) is split into pieces of at most this many, one warp each
/// (`mmv_q8_split`): a warp then waits for two spans' loads in turn, not nine. On the H200 with
/// the 1.5B model: decode 3% faster, prefill 9%, 16 sequences 8% (README, "CUDA").
const MATVEC_SPLIT_SPANS: usize = 64;
/// The fewest weight rows a one-row matvec launch takes two per warp ([`matvec_pairs`]). A pass
/// with fewer rows than the GPU holds warps at once waits on one warp's chain of loads, which
/// pairing lengthens by half: on the H200 (132 SMs, about 40 matvec warps each) the 1.5B's
/// q and k (1,792 rows) took 6.9 µs in pairs against 6.3, its gate and up (17,920) 17.2 against
/// 19.6 (`ncu`, one decode step).
const MATVEC_PAIRS_MIN_ROWS: usize = 8192;
/// The most warps a row is split between.
const MATVEC_MAX_SPLIT: usize = 8;
/// Weight rows per block of the tensor-core matmul (`MMQ_ROWS`).
const MMQ_WEIGHT_ROWS: u32 = 16;
/// Bytes after a matrix's last row that the tensor-core matmul may read: it copies rows to shared
/// memory in aligned 16-byte words, up to 30 bytes past what it needs.
const MMQ_WEIGHT_PADDING: usize = 32;
/// Threads per block of the tensor-core matmul (`MMQ_WARPS` warps).
const MMQ_THREADS: u32 = 8 * LANES;
/// Weight rows per block of the streamed tensor-core matmul (kernels/cuda/mmt.cu's
/// `MMT_BLOCK_ROWS`).
const MMT_WEIGHT_ROWS: usize = 64;
/// Activation rows per block of the streamed matmul (`MMT_TOKENS`).
const MMT_TILE_ROWS: usize = 8;
/// Activation rows per block of the streamed matmul's wide tiles (`MMT_WIDE_TOKENS`), which
/// large launches of passes of more than [`MMT_TILE_ROWS`] take ([`streamed_tile_rows`]).
const MMT_WIDE_TILE_ROWS: usize = 16;
/// The dynamic shared memory a block of the wide tiles is given (`MMT_WIDE_SHARED`; the kernel
/// stops with an error if given less than its stages).
const MMT_WIDE_SHARED_BYTES: u32 = 54 * 1024;
/// Wide tiles halve a launch's blocks, and each takes longer: they paid where narrow tiles
/// gave every SM two blocks or more. On an H100 (132 SMs) with the 1.5B, passes of 9 rows
/// (ncu, `tests/gpu/pass-kernels`): the output (4,748 narrow blocks) 248 -> 157 us, the Q6_K
/// down projection (432) 28.4 -> 23.7, gate and up (560) 27.5 -> 26.1; but q, k and v (256)
/// 13.1 -> 21.0 and o (192) 11.0 -> 12.5.
const MMT_WIDE_MIN_BLOCKS_PER_SM: usize = 2;
/// Threads per block of the streamed matmul (`MMT_WARPS` warps).
const MMT_THREADS: u32 = 4 * LANES;
/// Columns per super-block of the formats the streamed matmul takes (the K-quants').
const MMT_SUPERBLOCK: usize = 256;
/// The most ranges a streamed matmul cuts a row's super-blocks into (`MMT_ROW_MAX_RANGES`: its
/// one-row kernel takes a warp per range).
const MMT_MAX_SPLIT: usize = 16;
/// Super-blocks in a turn of the streamed matmul's one-row kernel: a warp's lanes take a
/// sub-block each.
const MMT_TURN_SUPERBLOCKS: usize = 4;
/// The streamed matmul's scratch holds the partial sums of fewer than this many row blocks
/// times ranges per SM ([`streamed_scratch_len`]), which bounds [`streamed_split`].
const MMT_SCRATCH_RANGES_PER_SM: usize = 2;
/// Weight rows per block of the streamed matmul's one-row kernel when rows are not cut into
/// ranges (`MMT_ROW_WARPS`), a warp each.
const MMT_ROW_WARPS: usize = 4;
/// Passes of up to this many activation rows take the streamed matmul's one-row kernel rather
/// than a tile on the tensor cores (the same bits); `MMT_ROW_MAX_ROWS` in kernels/cuda/mmt.cu,
/// whose lanes decode a sub-block's weights once for all of a pass's rows. On the H200 with
/// the 1.5B, each row then in turn: 1 row 1.38x as fast (decode 700-725 against 521-531
/// tok/s), 2 rows 1.15x, 3 rows level, 4 rows 0.87x. With the weights shared, on an H100: 2
/// rows 1.07x as fast again (README, "CUDA"), 3 and 4 rows 0.95x and 0.81x of the tiles.
const MMT_ROW_MAX_ROWS: usize = 2;
/// Threads per block of the f16 GEMM (`GEMM_THREADS`).
const GEMM_THREADS: u32 = 8 * LANES;
/// The width of a matrix the f16 GEMM takes is a multiple of this (`GEMM_BK`).
const GEMM_K_STEP: usize = 32;
/// Threads per block of the GEMM's conversions (`dequantize_f16_<format>`,
/// `activations_to_f16`).
const CONVERSION_THREADS: u32 = 256;
/// The weights each thread of `dequantize_f16_<format>` writes, in one 16-byte store.
const DEQUANTIZED_PER_THREAD: usize = 8;
/// A null device address, for an absent optional argument.
const NULL: KernelArg = KernelArg::U64(0);

/// The backend on one GPU of runtime `R` ([`CudaBackend`](crate::CudaBackend),
/// [`HipBackend`](crate::HipBackend)).
pub struct GpuBackend<R: Runtime> {
    runtime: R,
    kernels: Kernels<R::Function>,
    device: String,
    /// Bytes per second: the memory clock (double data rate) times the bus width.
    peak_bandwidth: Option<f64>,
    /// Streaming multiprocessors (compute units): the streamed matmul cuts rows into ranges
    /// until a launch has about one block for each.
    multiprocessors: usize,
    /// Whether forward passes are recorded and replayed as graphs (`R::GRAPHS_VAR=0` turns
    /// them off, to compare, to debug, or to profile each kernel).
    graphs: bool,
    /// The launch shapes of the kernels a host profile tunes.
    tuning: GpuTuning,
    /// The device-side buffers of [`Backend::argmax_rows`], grown to the most asked for.
    argmax: Mutex<ArgmaxBuffers<R>>,
    /// Where the GEMM of prompt rows finds its matrix in f16, dequantized just before it: one
    /// buffer as large as the largest matrix loaded for it (27.5 MB for the 1.5B's gate, not
    /// the 2.6 GB of f16 copies of all its layers). A larger matrix adds a larger buffer and
    /// keeps the others, which graphs recorded before may name; passes are issued one at a
    /// time, so one buffer serves every matrix in turn.
    f16_weights: Mutex<Vec<Buffer<R, u16>>>,
    /// Whether tokens are drawn on the device ([`Backend::samples_rows`]; `R::SAMPLING_VAR=0`
    /// leaves them to the host), and its buffers.
    samples_rows: bool,
    sampling: Mutex<sample::SampleBuffers<R>>,
    /// Whether the launches being issued may overlap the kernel before them: set by `run_pass`
    /// for the pass it runs ([`OVERLAP_MAX_TOKENS`]), off outside passes.
    overlap: AtomicBool,
    /// [`Backend::passes_recorded`].
    passes_recorded: AtomicU64,
    /// The launches left out (`R::SKIP_VAR`), to measure.
    skipped: SkippedLaunches,
}

/// Launches a backend leaves out, from a comma-separated list: a kernel family by the name
/// its launches report errors under (`rms_norm`, `attention`, `silu_mul`, `matmul`, ...) or a
/// matmul by its weight's role, the tensor name without its layer and `.weight`
/// (`matmul:ffn_down`, `matmul:attn_output`, `matmul:output`; a launch of several matrices, such
/// as q, k and v, goes by its first). For `tests/gpu/ablate`: what a decode step saves without
/// them is what they cost in it, overlapped as they run. The outputs are wrong.
#[derive(Debug, Default)]
struct SkippedLaunches(Vec<String>);

impl SkippedLaunches {
    fn parse(list: &str) -> Self {
        Self(
            list.split(',')
                .map(str::trim)
                .filter(|name| !name.is_empty())
                .map(str::to_owned)
                .collect(),
        )
    }

    fn op(&self, op: &str) -> bool {
        self.0.iter().any(|name| name == op)
    }

    /// Whether the matmuls of the weight tensor `tensor` (`blk.3.ffn_down.weight`) are left out.
    fn matmul(&self, tensor: &str) -> bool {
        let unlayered = tensor
            .strip_prefix("blk.")
            .and_then(|rest| rest.split_once('.'))
            .map_or(tensor, |(_, role)| role);
        let role = unlayered.strip_suffix(".weight").unwrap_or(unlayered);
        self.0
            .iter()
            .any(|name| name.strip_prefix("matmul:") == Some(role))
    }
}

impl<R: Runtime> std::fmt::Debug for GpuBackend<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBackend")
            .field("runtime", &R::NAME)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

/// The backend's error for a failed device operation `op`.
fn device_error<R: Runtime>(op: &'static str) -> impl FnOnce(String) -> Error {
    move |detail| Error::Device {
        backend: R::NAME,
        op,
        detail,
    }
}

/// The error a runtime gives when it cannot start on this machine.
pub(crate) fn unavailable<R: Runtime>(reason: String) -> Error {
    Error::Unavailable {
        backend: R::NAME,
        reason,
    }
}

/// Plain values that cross between host and device as their bytes.
///
/// # Safety
/// Implementors have no padding and every byte pattern is a valid value.
pub(crate) unsafe trait Element: Copy + 'static {}
// SAFETY: plain numbers, without padding; every bit pattern is a value.
unsafe impl Element for u8 {}
// SAFETY: as above.
unsafe impl Element for i8 {}
// SAFETY: as above.
unsafe impl Element for u16 {}
// SAFETY: as above.
unsafe impl Element for u32 {}
// SAFETY: as above.
unsafe impl Element for f32 {}

fn bytes_of<T: Element>(values: &[T]) -> &[u8] {
    // SAFETY: `Element` types have no padding, so their memory is initialised bytes.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), size_of_val(values)) }
}

fn bytes_of_mut<T: Element>(values: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `bytes_of`, and any bytes written back form valid `T`s.
    unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast(), size_of_val(values)) }
}

/// One kernel family (a `kernels/cuda/*.cu` file) compiled for one architecture (`86`,
/// `gfx1201`): a CUDA fatbin (cubin and PTX) or a HIP code object, listed by build.rs in
/// `$OUT_DIR/<runtime>_kernels.rs`.
pub(crate) struct KernelImage {
    pub(crate) family: &'static str,
    pub(crate) arch: &'static str,
    pub(crate) image: &'static [u8],
}

/// `len` values of `T` in device memory.
pub struct Buffer<R: Runtime, T> {
    raw: R::Buffer,
    address: u64,
    len: usize,
    element: PhantomData<T>,
}

impl<R: Runtime, T> std::fmt::Debug for Buffer<R, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer").field("len", &self.len).finish()
    }
}

impl<R: Runtime, T> Buffer<R, T> {
    /// The buffer as a kernel argument (its device address).
    fn arg(&self) -> KernelArg {
        self.arg_at(0)
    }

    /// The address of element `at` (at most `len`) as a kernel argument.
    fn arg_at(&self, at: usize) -> KernelArg {
        assert!(at <= self.len, "an address past the end of a buffer");
        KernelArg::U64(self.address + (at * size_of::<T>()) as u64)
    }
}

impl<R: Runtime> GpuBackend<R> {
    /// The backend on a started runtime, launching its kernels as `tuning` says;
    /// `function(family, name)` loads each kernel.
    pub(crate) fn start(
        runtime: R,
        device: String,
        peak_bandwidth: Option<f64>,
        multiprocessors: u32,
        tuning: GpuTuning,
        function: impl Fn(&str, &str) -> Result<R::Function, String>,
    ) -> Result<Self, Error> {
        tuning.validate()?;
        let kernels = Kernels::load(function)
            .map_err(|reason| unavailable::<R>(format!("{device}: {reason}")))?;
        let most_warps = |kernel| {
            runtime
                .max_block_threads(kernel)
                .map(|threads| threads / LANES)
                .map_err(device_error::<R>("kernel attributes"))
        };
        // The kernels whose blocks have a fixed least size: a split row's warps, the
        // tensor-core matmuls', the GEMM's, prompt rows' attention.
        let fixed = kernels
            .matvecs()
            .filter(|(_, split, _)| *split)
            .map(|(name, _, kernel)| (name, kernel, MATVEC_MAX_SPLIT as u32))
            .chain(
                kernels
                    .mmqs()
                    .map(|(name, kernel)| (name, kernel, MMQ_THREADS / LANES)),
            )
            .chain(kernels.mmts().flat_map(|(format, streamed)| {
                [
                    (
                        format!("mmt_{format}"),
                        &streamed.tiles,
                        MMT_THREADS / LANES,
                    ),
                    (
                        format!("mmt_wide_{format}"),
                        &streamed.wide_tiles,
                        MMT_THREADS / LANES,
                    ),
                    (
                        format!("mmt_row_{format}"),
                        &streamed.row,
                        MMT_MAX_SPLIT as u32,
                    ),
                    (
                        format!("mmt_pair_{format}"),
                        &streamed.pair,
                        MMT_ROW_WARPS as u32,
                    ),
                    (
                        format!("mmt_ranges_{format}"),
                        &streamed.ranges,
                        MMT_ROW_WARPS as u32,
                    ),
                ]
                .into_iter()
                .chain(streamed.mixed.iter().flat_map(move |(third, mixed)| {
                    let pair = format!("{format}_{}", third.name().to_lowercase());
                    [
                        (
                            format!("mmt_mixed_{pair}"),
                            &mixed.tiles,
                            MMT_THREADS / LANES,
                        ),
                        (
                            format!("mmt_wide_mixed_{pair}"),
                            &mixed.wide_tiles,
                            MMT_THREADS / LANES,
                        ),
                        (
                            format!("mmt_ranges_mixed_{pair}"),
                            &mixed.ranges,
                            MMT_ROW_WARPS as u32,
                        ),
                    ]
                }))
            }))
            .chain(kernels.prompt_gemm.iter().flat_map(|gemm| {
                GEMM_TILES
                    .iter()
                    .zip(&gemm.tiles)
                    .map(|((rows, weight_rows), kernel)| {
                        (
                            format!("gemm_f16_{rows}x{weight_rows}"),
                            kernel,
                            GEMM_THREADS / LANES,
                        )
                    })
            }))
            .chain(
                kernels
                    .prompt_attention
                    .iter()
                    .flat_map(PerHeadDim::named)
                    .map(|(name, kernel)| (name, kernel, PROMPT_ATTENTION_THREADS / LANES)),
            );
        for (name, kernel, needed) in fixed {
            let most = most_warps(kernel)?;
            if most < needed {
                return Err(unavailable::<R>(format!(
                    "{device}: kernel {name} takes at most {most} warps per block, and needs \
                     {needed}"
                )));
            }
        }
        for (format, streamed) in kernels.mmts() {
            let wide = std::iter::once(&streamed.wide_tiles)
                .chain(streamed.mixed.iter().map(|(_, mixed)| &mixed.wide_tiles));
            for kernel in wide {
                runtime
                    .allow_shared(kernel, MMT_WIDE_SHARED_BYTES)
                    .map_err(|why| {
                        unavailable::<R>(format!(
                            "{device}: the wide tiles of the {format} streamed matmul: {why}"
                        ))
                    })?;
            }
        }
        let tuned = kernels
            .matvecs()
            .map(|(name, _, kernel)| ("matvec_warps", tuning.matvec_warps, name, kernel))
            .chain(
                kernels
                    .attention
                    .named()
                    .chain(kernels.grouped_attention.named())
                    .map(|(name, kernel)| {
                        ("attention_warps", tuning.attention_warps, name, kernel)
                    }),
            );
        for (value, warps, name, kernel) in tuned {
            let most = most_warps(kernel)?;
            if warps > most {
                return Err(Error::Tuning(format!(
                    "{value} = {warps}: kernel {name} takes at most {most} warps per block on \
                     {device}"
                )));
            }
        }
        if tuning.prompt_gemm && kernels.prompt_gemm.is_none() {
            return Err(Error::Tuning(format!(
                "prompt_gemm = true: {device} has no f16 GEMM kernel (CUDA, sm_80 and later)"
            )));
        }
        if tuning.prompt_attention && kernels.prompt_attention.is_none() {
            return Err(Error::Tuning(format!(
                "prompt_attention = true: {device} has no tensor-core attention kernel (CUDA, \
                 sm_80 and later)"
            )));
        }
        if tuning.streamed_matmul && kernels.mmts().next().is_none() {
            return Err(Error::Tuning(format!(
                "streamed_matmul = true: {device} has no streamed matmul kernel (CUDA, sm_80 \
                 and later)"
            )));
        }
        let graphs = std::env::var_os(R::GRAPHS_VAR).is_none_or(|v| v != "0");
        let samples_rows = std::env::var_os(R::SAMPLING_VAR).is_none_or(|v| v != "0");
        let skipped = SkippedLaunches::parse(
            &std::env::var_os(R::SKIP_VAR)
                .unwrap_or_default()
                .to_string_lossy(),
        );
        Ok(Self {
            runtime,
            kernels,
            device,
            peak_bandwidth,
            multiprocessors: multiprocessors.max(1) as usize,
            graphs,
            tuning,
            argmax: Mutex::new(ArgmaxBuffers {
                chunk_values: None,
                chunk_indices: None,
                arrivals: None,
                best: None,
            }),
            f16_weights: Mutex::new(Vec::new()),
            samples_rows,
            sampling: Mutex::new(sample::SampleBuffers::new()),
            overlap: AtomicBool::new(false),
            passes_recorded: AtomicU64::new(0),
            skipped,
        })
    }

    fn zeros<T: Element>(&self, len: usize, what: &'static str) -> Result<Buffer<R, T>, Error> {
        // Runtimes take at least one byte: an empty buffer still has an address to pass.
        let raw = len
            .max(1)
            .checked_mul(size_of::<T>())
            .and_then(|bytes| self.runtime.alloc_zeroed(bytes).ok())
            .ok_or(Error::OutOfMemory {
                what,
                bytes: (len as u64).saturating_mul(size_of::<T>() as u64),
            })?;
        Ok(Buffer {
            address: self.runtime.address(&raw),
            raw,
            len,
            element: PhantomData,
        })
    }

    /// A buffer holding `host`.
    fn upload_new<T: Element>(
        &self,
        host: &[T],
        what: &'static str,
    ) -> Result<Buffer<R, T>, Error> {
        let mut buffer = self.zeros(host.len(), what)?;
        self.upload(host, &mut buffer)?;
        Ok(buffer)
    }

    /// Copies `host` to the start of `device` (the callers checked that it fits).
    fn upload<T: Element>(&self, host: &[T], device: &mut Buffer<R, T>) -> Result<(), Error> {
        if host.is_empty() {
            return Ok(());
        }
        assert!(host.len() <= device.len, "upload past the end of a buffer");
        self.runtime
            .upload(&mut device.raw, bytes_of(host))
            .map_err(device_error::<R>("upload"))
    }

    /// Copies the start of `device` to `host` once the work queued so far has run.
    fn download<T: Element>(
        &self,
        op: &'static str,
        device: &Buffer<R, T>,
        host: &mut [T],
    ) -> Result<(), Error> {
        assert!(
            host.len() <= device.len,
            "download past the end of a buffer"
        );
        self.runtime
            .download(&device.raw, bytes_of_mut(host))
            .map_err(device_error::<R>(op))
    }

    fn launch(
        &self,
        op: &'static str,
        function: &R::Function,
        grid: u32,
        block: u32,
        args: &[KernelArg],
    ) -> Result<(), Error> {
        self.launch_with_shared(op, function, grid, block, 0, args)
    }

    /// [`launch`](Self::launch) of a kernel that takes `shared_bytes` of dynamic shared memory
    /// (allowed when the backend started).
    fn launch_with_shared(
        &self,
        op: &'static str,
        function: &R::Function,
        grid: u32,
        block: u32,
        shared_bytes: u32,
        args: &[KernelArg],
    ) -> Result<(), Error> {
        if grid == 0 || self.skipped.op(op) {
            return Ok(());
        }
        let overlap = self.overlap.load(Ordering::Relaxed);
        // SAFETY: each call passes its kernel's parameters in the signature's order with its
        // types (kernels/cuda/*.cu), and checked every size the kernel indexes with first;
        // the kernels that take dynamic shared memory are given what they declare they use.
        unsafe {
            self.runtime
                .launch(function, grid, block, shared_bytes, args, overlap)
        }
        .map_err(device_error::<R>(op))
    }

    /// The most query heads of one KV head, up to the tuning's `attention_group`, that a block
    /// of attention over heads of `shape` takes: a divisor of the heads per KV head that has a
    /// kernel, or 1.
    fn attention_group(&self, shape: AttentionShape) -> u32 {
        let per_kv_head = shape.heads / shape.kv_heads.max(1);
        GROUPED_ATTENTION
            .groups
            .iter()
            .copied()
            .filter(|&group| {
                group <= self.tuning.attention_group
                    && per_kv_head.is_multiple_of(group as usize)
                    && self
                        .kernels
                        .grouped_attention
                        .get(shape.head_dim, group)
                        .is_some()
            })
            .max()
            .unwrap_or(1)
    }

    /// `attention`'s launch; with `fresh`, the pass's unrotated k and v, which the kernel
    /// rotates and stores as `rope_store_kv` would (q unrotated too: `attend`).
    #[allow(clippy::too_many_arguments)]
    fn launch_attention(
        &self,
        q: &GpuActivations<R>,
        fresh: Option<(&GpuActivations<R>, &GpuActivations<R>)>,
        cache: &GpuKvCache<R>,
        layer: usize,
        batch: &GpuBatch<R>,
        shape: AttentionShape,
        out: &mut GpuActivations<R>,
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
        let launch = batch.attention;
        let kernel = match launch.group {
            1 => self.kernels.attention.get(shape.head_dim),
            group => self.kernels.grouped_attention.get(shape.head_dim, group),
        }
        .ok_or_else(|| Error::Shape {
            op: "attention",
            detail: format!(
                "heads of {} dimensions: the {} backend has no attention kernel for them",
                shape.head_dim,
                R::NAME
            ),
        })?;
        let rows = batch.host.len();
        // A pass that rotates and stores K and V in its attention has no prompt rows where
        // they take their own kernel ([`Self::set_batch`]).
        let prompt = match fresh {
            Some(_) => 0,
            None => self.launch_prompt_attention(q, cache, layer, batch, shape, out)?,
        };
        if prompt == rows {
            return Ok(());
        }
        let d = &batch.device;
        let (out, quantized) = out.written_quantized(rows);
        self.launch(
            "attention",
            kernel,
            ((rows - prompt) * shape.heads) as u32 / launch.group * launch.blocks_per_head,
            launch.block_warps * LANES,
            &[
                int(prompt),
                q.data.arg(),
                cache.k[layer].arg(),
                cache.v[layer].arg(),
                d.positions.arg(),
                d.table_offsets.arg(),
                d.block_ids.arg(),
                int(l.block_tokens),
                int(shape.heads),
                int(shape.kv_heads),
                shape.scale.into(),
                int(self.tuning.attention_warps as usize),
                int(launch.blocks_per_head as usize),
                d.split_parts.arg(),
                d.split_arrivals.arg(),
                out,
                quantized,
                fresh.map_or(NULL, |(k, _)| k.data.arg()),
                fresh.map_or(NULL, |(_, v)| v.data.arg()),
                d.cos.arg(),
                d.sin.arg(),
                int(batch.rope.rotary_dims),
                i32::from(batch.rope.style == RopeStyle::Neox).into(),
            ],
        )
    }

    /// Launches the attention of the batch's prompt rows on the tensor cores where the host
    /// profile asks for it (`prompt_attention`) and the images have the kernel for these heads;
    /// returns how many leading rows it took (0 or the prompt rows). Its bits are not
    /// `attention_<head_dim>`'s, which the other rows take ([`Backend::prompt_rows_from`]).
    fn launch_prompt_attention(
        &self,
        q: &GpuActivations<R>,
        cache: &GpuKvCache<R>,
        layer: usize,
        batch: &GpuBatch<R>,
        shape: AttentionShape,
        out: &mut GpuActivations<R>,
    ) -> Result<usize, Error> {
        let prompt = batch.host.prompt_tokens();
        let kernel = match self
            .kernels
            .prompt_attention
            .as_ref()
            .and_then(|k| k.get(shape.head_dim))
        {
            Some(kernel) if self.tuning.prompt_attention && prompt > 0 => kernel,
            _ => return Ok(0),
        };
        let d = &batch.device;
        let (out, quantized) = out.written_quantized(batch.host.len());
        self.launch(
            "prompt_attention",
            kernel,
            (prompt.div_ceil(PROMPT_ATTENTION_ROWS) * shape.heads) as u32,
            PROMPT_ATTENTION_THREADS,
            &[
                q.data.arg(),
                cache.k[layer].arg(),
                cache.v[layer].arg(),
                d.positions.arg(),
                d.table_offsets.arg(),
                d.block_ids.arg(),
                int(cache.layout.block_tokens),
                int(prompt),
                int(shape.heads),
                int(shape.kv_heads),
                shape.scale.into(),
                out,
                quantized,
            ],
        )?;
        Ok(prompt)
    }

    /// Whether the streamed matmul (where the host profile asks for it) multiplies `rows`
    /// activation rows on its tensor-core tiles rather than its one-row kernel.
    fn streamed_tiles(&self, rows: usize) -> bool {
        self.tuning.streamed_matmul && rows > MMT_ROW_MAX_ROWS
    }

    /// Runs `issue`, whose launches make up a pass of `shape`, with launches overlapping when
    /// the pass is short enough to gain from it and its matmuls are not the streamed matmul's
    /// tiles: a tile kernel's many blocks share the SMs with the next kernel's, started early
    /// and waiting. On the H200 with the 1.5B and the streamed matmul, passes of 3 and 4 tokens
    /// took 2.5 ms overlapped and 2.0 ms launched in turn (3 and 4 sequences decoded at
    /// 1,196-1,217 and 1,601-1,625 tok/s against 1,449-1,457 and 1,923-1,963), while the
    /// one-row kernel's passes of 1 and 2 tokens gain from overlapping (712 and 988 tok/s
    /// against 638 and 933).
    fn overlapping<T>(&self, shape: PassShape, issue: impl FnOnce() -> T) -> T {
        self.overlap.store(
            shape.tokens <= OVERLAP_MAX_TOKENS && !self.streamed_tiles(shape.tokens),
            Ordering::Relaxed,
        );
        let issued = issue();
        self.overlap.store(false, Ordering::Relaxed);
        issued
    }

    /// The quantized copy of the first `rows` rows of `x`, made unless the operations issued
    /// since `x` was last written already made it.
    fn quantize<'a>(
        &self,
        x: &'a GpuActivations<R>,
        rows: usize,
    ) -> Result<&'a Quantized<R>, Error> {
        let quantized = x.quantized.as_ref().ok_or_else(|| Error::Shape {
            op: "matmul",
            detail: if x.cols.is_multiple_of(QUANT_GROUP) {
                "quantized weights take activations allocated as a matmul's input, not \
                 ActivationUse::Plain"
                    .to_owned()
            } else {
                format!(
                    "quantized weights take activations whose width is a multiple of \
                     {QUANT_GROUP}, not {}",
                    x.cols
                )
            },
        })?;
        if x.quantized_rows.get() < rows {
            let groups = (rows * x.cols / QUANT_GROUP) as i64;
            let grid = (groups as u64).div_ceil(u64::from(WARPS_PER_BLOCK)) as u32;
            self.launch(
                "quantize",
                &self.kernels.quantize_q8,
                grid,
                WARPS_PER_BLOCK * LANES,
                &[x.data.arg(), groups.into(), quantized.out().into()],
            )?;
            x.quantized_rows.set(rows);
        }
        Ok(quantized)
    }

    /// The matvec instance of `format` for `rows` activation rows and `weight_rows` weight rows
    /// (of all the matrices launched together) of `cols` columns, and how it launches. Where
    /// the host profile asks for the streamed matmul and the format has one, that for any
    /// number of rows. Else from the host profile's `mmq_rows` rows, the tensor-core matmul
    /// with the smallest tile that holds them (or its largest), where there is one. The
    /// one-row instance takes any number of rows, one after another; the host profile's
    /// `matvec_loop_rows` says up to how many; it takes weight rows two per warp where
    /// [`matvec_pairs`] says. The one-row and four-row instances hold fewer registers than the
    /// eight-row one and take up to [`MATVEC_PARTS`] matrices, unless the rows are split
    /// ([`matvec_split`]); the float formats have one instance, for one matrix.
    fn matvec_instance<'f>(
        &self,
        format: &'f FormatKernels<R::Function>,
        rows: usize,
        cols: usize,
        weight_rows: usize,
    ) -> (&'f R::Function, MatvecLaunch) {
        if let Some(mmt) = &format.mmt
            && self.tuning.streamed_matmul
        {
            return if self.streamed_tiles(rows) {
                (&mmt.tiles, MatvecLaunch::Streamed)
            } else {
                (&mmt.row, MatvecLaunch::StreamedRow)
            };
        }
        if let Some(mmq) = &format.mmq
            && rows >= self.tuning.mmq_rows as usize
        {
            let i = MMQ_TILE_ROWS
                .iter()
                .position(|&tile| rows <= tile as usize)
                .unwrap_or(MMQ_TILE_ROWS.len() - 1);
            let split_spans = matvec_split(cols).map_or(0, |(_, piece_spans)| piece_spans);
            return (
                &mmq[i],
                MatvecLaunch::Tiles {
                    tile_rows: MMQ_TILE_ROWS[i],
                    split_spans,
                },
            );
        }
        let one_row = format.mmv1.is_some() && rows <= self.tuning.matvec_loop_rows as usize;
        let four_rows = format.mmv4.is_some() && rows <= MATVEC_FUSED_ROWS;
        if let (Some([mmv, mmv1, mmv4]), Some((pieces, piece_spans))) =
            (&format.split, matvec_split(cols))
        {
            let split = MatvecLaunch::Split {
                pieces,
                piece_spans,
            };
            return match (one_row, four_rows) {
                (true, _) => (mmv1, split),
                (_, true) => (mmv4, split),
                _ => (mmv, split),
            };
        }
        match (&format.mmv1, &format.mmv1p, &format.mmv4) {
            (Some(_), Some(mmv1p), _) if one_row && matvec_pairs(cols, weight_rows) => {
                (mmv1p, MatvecLaunch::Pairs)
            }
            (Some(mmv1), _, _) if one_row => (mmv1, MatvecLaunch::Parts),
            (_, _, Some(mmv4)) if four_rows => (mmv4, MatvecLaunch::Parts),
            _ => (&format.mmv, MatvecLaunch::Alone),
        }
    }

    /// One matvec launch over `parts` for `rows` activation rows from row `first` of `x` and
    /// of the outputs, checked by the caller and grouped as
    /// [`matvec_instance`](Self::matvec_instance) allows; one warp per weight row of them all,
    /// or per piece of a split row, or on the tensor cores one block per [`MMQ_WEIGHT_ROWS`]
    /// weight rows and tile of activation rows.
    fn matvec(
        &self,
        x: &GpuActivations<R>,
        first: usize,
        rows: usize,
        parts: &mut [Projection<'_, Self>],
    ) -> Result<(), Error> {
        let format = &parts[0].matrix.format;
        let warps = self.tuning.matvec_warps;
        if format.mmv1.is_none() {
            // The float formats take f32 activations, in their one instance.
            let [Projection { matrix, bias, out }] = parts else {
                unreachable!("float matrices launch alone");
            };
            return self.launch(
                "matmul",
                &format.mmv,
                (matrix.rows as u32).div_ceil(warps),
                warps * LANES,
                &[
                    matrix.data.arg(),
                    (matrix.row_bytes as u64).into(),
                    int(matrix.rows),
                    int(matrix.cols),
                    x.data.arg_at(first * x.cols),
                    int(rows),
                    bias.map_or(NULL, |bias| bias.data.arg()),
                    out.written_from(first),
                ],
            );
        }
        let q = self.quantize(x, first + rows)?;
        if let Some(p) = parts.iter().find(|p| p.matrix.precision != q.precision) {
            return Err(Error::Shape {
                op: "matmul",
                detail: format!(
                    "{}, loaded for {} activations, given activations quantized at {}",
                    p.matrix.tensor, p.matrix.precision, q.precision
                ),
            });
        }
        let (row_bytes, cols) = (parts[0].matrix.row_bytes, parts[0].matrix.cols);
        let [hi, lo, scales, sums] = q.args_from(first * x.cols);
        let activations = [hi, lo, scales, sums, int(rows)];
        if let Some(kernels) = self.streamed_kernels(parts) {
            return self.streamed_matmul(kernels, x, activations, first, rows, parts);
        }
        let weight_rows = parts.iter().map(|p| p.matrix.rows).sum();
        let (mmv, launch) = match self.mixed_matvec(rows, parts) {
            Some(mixed) => (mixed, MatvecLaunch::Parts),
            None => self.matvec_instance(format, rows, cols, weight_rows),
        };
        // The instances of one matrix: the spans per piece they take, their grid and block.
        let matrix_rows = parts[0].matrix.rows as u32;
        let alone = match launch {
            MatvecLaunch::Tiles {
                tile_rows,
                split_spans,
            } => Some((
                split_spans,
                matrix_rows.div_ceil(MMQ_WEIGHT_ROWS) * (rows as u32).div_ceil(tile_rows),
                MMQ_THREADS,
            )),
            MatvecLaunch::Split {
                pieces,
                piece_spans,
            } => {
                // Whole rows per block, at least one whatever matvec_warps says.
                let block_rows = (warps / pieces).max(1);
                Some((
                    piece_spans,
                    matrix_rows.div_ceil(block_rows),
                    block_rows * pieces * LANES,
                ))
            }
            MatvecLaunch::Parts
            | MatvecLaunch::Pairs
            | MatvecLaunch::Alone
            | MatvecLaunch::Streamed
            | MatvecLaunch::StreamedRow => None,
        };
        if let Some((piece_spans, grid, block)) = alone {
            let [Projection { matrix, bias, out }] = parts else {
                unreachable!("split and tensor-core matmuls launch alone");
            };
            let mut args = vec![
                matrix.data.arg(),
                int(matrix.rows),
                bias.map_or(NULL, |bias| bias.data.arg()),
                out.written_from(first),
                (row_bytes as u64).into(),
                int(cols),
                int(piece_spans as usize),
            ];
            args.extend(activations);
            return self.launch("matmul", mmv, grid, block, &args);
        }
        let mut args = parts_args(parts, first);
        args.extend([(row_bytes as u64).into(), int(cols)]);
        args.extend(activations);
        let rows_per_warp = if launch == MatvecLaunch::Pairs { 2 } else { 1 };
        let grid = (weight_rows as u32).div_ceil(rows_per_warp * warps);
        self.launch("matmul", mmv, grid, warps * LANES, &args)
    }

    /// The streamed matmul's kernels for a launch over `parts`, where the host profile asks
    /// for it and their format has one: the format's own, or, where the third matrix is in
    /// another format than the first two ([`streamed_mixed`](Self::streamed_mixed)), the
    /// pair's.
    fn streamed_kernels<'f>(
        &self,
        parts: &[Projection<'f, Self>],
    ) -> Option<StreamedKernels<'f, R::Function>> {
        if !self.tuning.streamed_matmul {
            return None;
        }
        if let Some(mixed) = self.streamed_mixed(parts) {
            return Some(StreamedKernels::Mixed(mixed));
        }
        let matrix = &parts[0].matrix;
        matrix
            .format
            .streamed(matrix.precision)
            .map(StreamedKernels::Format)
    }

    /// The streamed matmul over `parts` whose third matrix is in another format than the first
    /// two (a Q4_K_M file's q and k in Q4_K, its v in Q6_K), so that they take one launch: where
    /// the images have the pair and the three matrices' rows, launched together, are cut into
    /// ranges of at most two super-blocks ([`streamed_short_ranges`]), the rows its one-row
    /// kernel takes. That depends on the matrices alone, so every pass launches them alike and
    /// a row gets the same bits in any of them.
    fn streamed_mixed<'f>(
        &self,
        parts: &[Projection<'f, Self>],
    ) -> Option<&'f StreamedMixed<R::Function>> {
        let [first, _, third] = mixed_formats(parts)?;
        let (format, third_format) = (&first.matrix.format, &third.matrix.format);
        let precision = first.matrix.precision;
        if !self.tuning.streamed_matmul || third_format.streamed(precision).is_none() {
            return None;
        }
        let row_blocks: usize = parts
            .iter()
            .map(|p| p.matrix.rows.div_ceil(MMT_WEIGHT_ROWS))
            .sum();
        let superblocks = first.matrix.cols / MMT_SUPERBLOCK;
        let ksplit = streamed_split(row_blocks, superblocks, self.multiprocessors);
        if !streamed_short_ranges(superblocks, ksplit) {
            return None;
        }
        paired(&format.streamed(precision)?.mixed, third_format.ty)
    }

    /// The one-row matvec over `parts` whose third matrix is in another format than the first
    /// two (`mmv_q8_mixed`: a Q4_K_M file's q and k in Q4_K, its v in Q6_K), so that they take
    /// one launch: where the images have the pair and both formats' matrices would run their
    /// one-row instance one row per warp.
    fn mixed_matvec<'f>(
        &self,
        rows: usize,
        parts: &[Projection<'f, Self>],
    ) -> Option<&'f R::Function> {
        let [first, second, third] = mixed_formats(parts)?;
        let (format, third_format) = (&first.matrix.format, &third.matrix.format);
        let one_row_unpaired = |format: &FormatKernels<R::Function>, weight_rows| {
            rows <= self.tuning.matvec_loop_rows as usize
                && matches!(
                    self.matvec_instance(format, rows, first.matrix.cols, weight_rows),
                    (_, MatvecLaunch::Parts)
                )
        };
        if !one_row_unpaired(format, first.matrix.rows + second.matrix.rows)
            || !one_row_unpaired(third_format, third.matrix.rows)
        {
            return None;
        }
        paired(&format.mmv1_mixed, third_format.ty)
    }

    /// One streamed matmul launch (kernels/cuda/mmt.cu) over `parts`, checked by the caller.
    /// On the tensor cores: a block per [`MMT_WEIGHT_ROWS`] weight rows of them all, range of
    /// super-blocks ([`streamed_split`]) and tile of activation rows ([`streamed_tile_rows`],
    /// [`MMT_TILE_ROWS`] or [`MMT_WIDE_TILE_ROWS`]). Up to
    /// [`MMT_ROW_MAX_ROWS`] activation rows, through the one-row kernel, all at once: a warp
    /// per range of a weight row, [`MMT_ROW_WARPS`] rows per block without ranges (two rows per
    /// warp where [`streamed_pairs`] says), a block per row with them (a warp per row, two
    /// ranges a turn, where [`streamed_short_ranges`] says).
    fn streamed_matmul(
        &self,
        kernels: StreamedKernels<'_, R::Function>,
        x: &GpuActivations<R>,
        activations: [KernelArg; 5],
        first: usize,
        rows: usize,
        parts: &mut [Projection<'_, Self>],
    ) -> Result<(), Error> {
        let scratch = x.streamed.as_ref().ok_or_else(|| Error::Shape {
            op: "matmul",
            detail: format!(
                "the streamed matmul takes activations whose width is a multiple of \
                 {MMT_SUPERBLOCK}, not {}",
                x.cols
            ),
        })?;
        let (row_bytes, cols) = (parts[0].matrix.row_bytes, parts[0].matrix.cols);
        let weight_rows: usize = parts.iter().map(|p| p.matrix.rows).sum();
        let row_blocks: usize = parts
            .iter()
            .map(|p| p.matrix.rows.div_ceil(MMT_WEIGHT_ROWS))
            .sum();
        let ksplit = streamed_split(row_blocks, cols / MMT_SUPERBLOCK, self.multiprocessors);
        let mut args = parts_args(parts, first);
        args.extend([(row_bytes as u64).into(), int(cols)]);
        args.extend(activations);
        let superblocks = cols / MMT_SUPERBLOCK;
        let row_warps = MMT_ROW_WARPS as u32 * LANES;
        let one_row = !self.streamed_tiles(rows);
        if let StreamedKernels::Format(streamed) = kernels
            && one_row
            && streamed_pairs(superblocks, ksplit, weight_rows)
        {
            let grid = weight_rows.div_ceil(2 * MMT_ROW_WARPS) as u32;
            return self.launch("matmul", &streamed.pair, grid, row_warps, &args);
        }
        args.push(int(ksplit));
        if one_row {
            // A warp per row, MMT_ROW_WARPS rows a block: with one or two rows a block, the
            // 1.5B decoded at 786 or 816-818 tok/s on the H200, with four 815-820.
            let grid = weight_rows.div_ceil(MMT_ROW_WARPS) as u32;
            return match kernels {
                StreamedKernels::Mixed(mixed) => {
                    assert!(
                        streamed_short_ranges(superblocks, ksplit),
                        "a mixed streamed launch of rows not cut into short ranges"
                    );
                    self.launch("matmul", &mixed.ranges, grid, row_warps, &args)
                }
                StreamedKernels::Format(streamed) if streamed_short_ranges(superblocks, ksplit) => {
                    self.launch("matmul", &streamed.ranges, grid, row_warps, &args)
                }
                StreamedKernels::Format(streamed) if ksplit == 1 => {
                    self.launch("matmul", &streamed.row, grid, row_warps, &args)
                }
                StreamedKernels::Format(streamed) => self.launch(
                    "matmul",
                    &streamed.row,
                    weight_rows as u32,
                    ksplit as u32 * LANES,
                    &args,
                ),
            };
        }
        let tile_rows = streamed_tile_rows(rows, ksplit * row_blocks, self.multiprocessors);
        let (mmt, shared_bytes) = match (kernels, tile_rows == MMT_WIDE_TILE_ROWS) {
            (StreamedKernels::Format(streamed), false) => (&streamed.tiles, 0),
            (StreamedKernels::Mixed(mixed), false) => (&mixed.tiles, 0),
            (StreamedKernels::Format(streamed), true) => {
                (&streamed.wide_tiles, MMT_WIDE_SHARED_BYTES)
            }
            (StreamedKernels::Mixed(mixed), true) => (&mixed.wide_tiles, MMT_WIDE_SHARED_BYTES),
        };
        let tiles = rows.div_ceil(tile_rows);
        assert!(
            ksplit == 1
                || (tiles * ksplit * row_blocks * MMT_WEIGHT_ROWS * tile_rows
                    <= scratch.partials.len
                    && tiles * row_blocks <= scratch.counters.len),
            "streamed matmul scratch smaller than its bound"
        );
        let grid = u32::try_from(tiles * ksplit * row_blocks).map_err(|_| Error::Shape {
            op: "matmul",
            detail: format!("{rows} activation rows over {row_blocks} row blocks: too many blocks"),
        })?;
        args.extend([scratch.partials.arg(), scratch.counters.arg()]);
        self.launch_with_shared("matmul", mmt, grid, MMT_THREADS, shared_bytes, &args)
    }

    /// Makes [`f16_weights`](Self::f16_weights) hold a matrix of `rows` x `cols` (`name`).
    fn reserve_f16_weights(&self, rows: usize, cols: usize, name: &str) -> Result<(), Error> {
        let elements = rows.checked_mul(cols).ok_or_else(|| Error::Shape {
            op: "load_matrix",
            detail: format!("{name}: {rows} x {cols} weights are too many to dequantize"),
        })?;
        let mut buffers = self.f16_weights.lock().unwrap_or_else(|e| e.into_inner());
        if buffers.last().is_none_or(|largest| largest.len < elements) {
            buffers.push(self.zeros(elements, "f16 weights")?);
        }
        Ok(())
    }

    /// The first `prompt` rows of `x` times each projection's matrix in f16
    /// (kernels/cuda/gemm.cu), checked by the caller: the rows converted to f16 into `half`
    /// once, then for each matrix its dequantization into the f16 weight buffer and a GEMM in
    /// the tile [`gemm_tile`] picks.
    fn prompt_gemm(
        &self,
        gemm: &PromptGemm<R::Function>,
        x: &GpuActivations<R>,
        half: &Buffer<R, u16>,
        prompt: usize,
        parts: &mut [Projection<'_, Self>],
    ) -> Result<(), Error> {
        let values = prompt * x.cols;
        let pairs = (values / 2).div_ceil(CONVERSION_THREADS as usize);
        self.launch(
            "matmul",
            &gemm.to_f16,
            pairs as u32,
            CONVERSION_THREADS,
            &[x.data.arg(), (values as i64).into(), half.arg()],
        )?;
        let f16_weights = self.f16_weights.lock().unwrap_or_else(|e| e.into_inner());
        let weights = f16_weights.last().expect("allocated with the matrices");
        for Projection { matrix, bias, out } in parts {
            let dequantize = matrix
                .format
                .dequantize_f16
                .as_ref()
                .expect("checked when the matrix loaded");
            let elements = matrix.rows * matrix.cols;
            assert!(
                elements <= weights.len,
                "f16 weight buffer smaller than a matrix loaded for it"
            );
            let threads = (elements / DEQUANTIZED_PER_THREAD).div_ceil(CONVERSION_THREADS as usize);
            self.launch(
                "matmul",
                dequantize,
                u32::try_from(threads).map_err(|_| Error::Shape {
                    op: "matmul",
                    detail: format!("{elements} weights are too many to dequantize"),
                })?,
                CONVERSION_THREADS,
                &[
                    matrix.data.arg(),
                    (matrix.row_bytes as u64).into(),
                    int(matrix.rows),
                    int(matrix.cols),
                    weights.arg(),
                ],
            )?;
            let tile = gemm_tile(prompt, matrix.rows);
            let (tile_rows, tile_weight_rows) = GEMM_TILES[tile];
            let grid = prompt.div_ceil(tile_rows) * matrix.rows.div_ceil(tile_weight_rows);
            self.launch(
                "matmul",
                &gemm.tiles[tile],
                grid as u32,
                GEMM_THREADS,
                &[
                    half.arg(),
                    weights.arg(),
                    bias.map_or(NULL, |bias| bias.data.arg()),
                    int(prompt),
                    int(matrix.rows),
                    int(matrix.cols),
                    out.written(),
                ],
            )?;
        }
        Ok(())
    }

    /// The row norm kernel over `rows` rows at `x`, shaped as `out`, after adding `y` to them
    /// unless it is null; the caller checked the shapes.
    fn norm_rows(
        &self,
        x: KernelArg,
        y: KernelArg,
        weight: &GpuVector<R>,
        eps: f32,
        rows: usize,
        out: &mut GpuActivations<R>,
    ) -> Result<(), Error> {
        let cols = out.cols;
        if cols > NORM_MAX_COLS {
            return Err(Error::Shape {
                op: "rms_norm",
                detail: format!(
                    "rows of {cols} values; the {} backend's norm takes at most {NORM_MAX_COLS}",
                    R::NAME
                ),
            });
        }
        let (out, quantized) = out.written_quantized(rows);
        self.launch(
            "rms_norm",
            &self.kernels.rms_norm,
            rows as u32,
            NORM_WARPS * LANES,
            &[
                x,
                y,
                weight.data.arg(),
                eps.into(),
                int(cols),
                out,
                quantized,
            ],
        )
    }

    /// Records what `enqueue` issues as a graph, without running it.
    fn record<F>(&self, cache: &mut GpuKvCache<R>, enqueue: F) -> Result<R::Graph, Error>
    where
        F: FnOnce(&mut GpuKvCache<R>) -> Result<(), Error>,
    {
        self.runtime
            .begin_recording()
            .map_err(device_error::<R>("record"))?;
        let issued = enqueue(cache);
        // The recording ends whatever happened, so that the stream is usable again.
        let graph = self.runtime.end_recording();
        issued?;
        graph
            .map_err(device_error::<R>("record"))?
            .ok_or_else(|| Error::Device {
                backend: R::NAME,
                op: "record",
                detail: "the recorded forward pass is empty".into(),
            })
    }
}

/// The forward passes recorded for one workspace, by shape and KV cache.
pub struct GpuRecordings<R: Runtime> {
    graphs: HashMap<(PassShape, u64), R::Graph>,
}

impl<R: Runtime> std::fmt::Debug for GpuRecordings<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuRecordings")
            .field("graphs", &self.graphs.len())
            .finish()
    }
}

/// A weight matrix in device memory, in its GGUF block layout.
pub struct GpuMatrix<R: Runtime> {
    data: Buffer<R, u8>,
    /// Its tensor's name in the file.
    tensor: String,
    /// The precision its activations are quantized at.
    precision: ActivationPrecision,
    /// Whether the matrix's prompt rows go through the f16 GEMM: where the host profile asks
    /// for it (`prompt_gemm`), the model gives the matrix prompt rows, the images have the
    /// GEMM and the width is a multiple of its K step.
    prompt_gemm: bool,
    format: Arc<FormatKernels<R::Function>>,
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

impl<R: Runtime> std::fmt::Debug for GpuMatrix<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuMatrix")
            .field("tensor", &self.tensor)
            .field("type", &self.format.ty)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish_non_exhaustive()
    }
}

/// An f32 vector in device memory.
#[derive(Debug)]
pub struct GpuVector<R: Runtime> {
    data: Buffer<R, f32>,
    len: usize,
}

/// A row-major f32 matrix in device memory, with room for its copy quantized for the matvec.
#[derive(Debug)]
pub struct GpuActivations<R: Runtime> {
    data: Buffer<R, f32>,
    rows: usize,
    cols: usize,
    /// Present when `cols` is a multiple of 32 (every quantized matrix's width).
    quantized: Option<Quantized<R>>,
    /// How many leading rows `quantized` holds, as of the operations issued so far; every
    /// operation that writes the matrix resets it through [`written`](Self::written).
    quantized_rows: Cell<usize>,
    /// Present when the streamed matmul may take these activations: the host profile asks for
    /// it (the backend starts only where the device has it), and `cols` is a multiple of its
    /// super-blocks.
    streamed: Option<StreamedScratch<R>>,
    /// Room for the prompt rows in f16, the GEMM's input: present where a matmul of prompt rows
    /// reads these activations (`ActivationUse::MatmulInput { prompt_rows: true }`), the host
    /// profile asks for the GEMM (the backend starts only where the device has it) and `cols`
    /// is a multiple of its K step.
    half: Option<Buffer<R, u16>>,
}

/// Where the streamed matmul over these activations keeps its ranges' partial sums, and the
/// counters that tell each row block's last range to add them (left at zero by the kernel).
#[derive(Debug)]
struct StreamedScratch<R: Runtime> {
    partials: Buffer<R, f32>,
    counters: Buffer<R, u32>,
}

/// Activations quantized in groups of 32, in two 8-bit parts or the high one alone
/// (kernels/cuda/q8.cuh).
#[derive(Debug)]
struct Quantized<R: Runtime> {
    /// The precision the copy is made at: at [`ActivationPrecision::Single`] `lo` stays the
    /// zeros it was allocated as.
    precision: ActivationPrecision,
    hi: Buffer<R, i8>,
    lo: Buffer<R, i8>,
    /// `(d_hi, d_lo)` per group.
    scales: Buffer<R, f32>,
    /// `d_hi * sum(hi) + d_lo * sum(lo)` per 16 values.
    sums: Buffer<R, f32>,
}

impl<R: Runtime> Quantized<R> {
    /// The copy from value `at` (the start of a row) on: its parts, scales and sums, for a
    /// kernel that reads it.
    fn args_from(&self, at: usize) -> [KernelArg; 4] {
        [
            self.hi.arg_at(at),
            self.lo.arg_at(at),
            self.scales.arg_at(2 * (at / QUANT_GROUP)),
            self.sums.arg_at(at / 16),
        ]
    }

    /// The copy's addresses, for a kernel that writes it (no low part at
    /// [`ActivationPrecision::Single`]: the kernels then write the high part alone).
    fn out(&self) -> QuantizedOut {
        QuantizedOut {
            hi: self.hi.address,
            lo: match self.precision {
                ActivationPrecision::Split => self.lo.address,
                ActivationPrecision::Single => 0,
            },
            scales: self.scales.address,
            sums: self.sums.address,
        }
    }
}

impl<R: Runtime> GpuActivations<R> {
    fn dims(&self) -> Dims {
        Dims {
            rows: self.rows,
            cols: self.cols,
        }
    }

    /// The data, for an operation that writes it: its quantized copy is stale from then on.
    fn written(&mut self) -> KernelArg {
        self.written_from(0)
    }

    /// The data from row `row` on, for an operation that writes those rows: the quantized
    /// copy is stale from then on.
    fn written_from(&mut self, row: usize) -> KernelArg {
        self.quantized_rows.set(0);
        self.data.arg_at(row * self.cols)
    }

    /// The data and where its quantized copy goes, for a kernel that writes both for the first
    /// `rows` rows (nulls when the width cannot be quantized, and the kernel writes the data
    /// only).
    fn written_quantized(&mut self, rows: usize) -> (KernelArg, KernelArg) {
        let out = match &self.quantized {
            Some(q) => {
                self.quantized_rows.set(rows);
                q.out()
            }
            None => {
                self.quantized_rows.set(0);
                QuantizedOut::default()
            }
        };
        (self.data.arg(), out.into())
    }
}

/// A KV cache pool in device memory: per layer, `[block][slot][kv_head][head_dim]` in f16.
#[derive(Debug)]
pub struct GpuKvCache<R: Runtime> {
    /// Unique among the pools of this process: recordings are kept per pool.
    id: u64,
    layout: KvLayout,
    k: Vec<Buffer<R, u16>>,
    v: Vec<Buffer<R, u16>>,
}

/// A batch's metadata in device buffers of fixed capacity, with the host copy the checks read.
#[derive(Debug)]
pub struct GpuBatch<R: Runtime> {
    capacity: BatchCapacity,
    rope: Rope,
    host: RaggedBatch,
    table_offsets: Vec<u32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// Attention's query heads.
    heads: usize,
    /// The query heads a block of attention takes where one a block would outnumber the SMs
    /// ([`AttentionLaunch::of`]).
    attention_group: u32,
    attention: AttentionLaunch,
    device: DeviceBatch<R>,
}

/// How a batch's attention is launched, from its positions alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AttentionLaunch {
    /// Blocks per (token, head): each takes one range of the positions, or one takes them all
    /// ([`ATTENTION_SPLITS`]).
    blocks_per_head: u32,
    /// Warps per block, each taking the tuning's `attention_warps` parts of a head in turn
    /// with the same arithmetic whatever their number.
    block_warps: u32,
    /// Query heads per block, of one KV head (`attention_<head_dim>_x<group>` from 2).
    group: u32,
    /// Whether attention rotates q and k and stores K and V itself, as `rope_store_kv` would
    /// (a pass where each sequence has one token: [`Backend::attend`]; with `prompt_attention`,
    /// none of them a prompt token, whose attention kernel does not store).
    rotates_and_stores: bool,
}

impl AttentionLaunch {
    /// The launch for a batch whose tokens are at `positions`, with `heads` query heads of
    /// `warps` parts each, on a GPU of `multiprocessors` SMs; `split` lets a head's ranges have
    /// blocks of their own, and `group` query heads of one KV head may share a block.
    ///
    /// A pass with more blocks than SMs gets as many warps per block as its longest sequence has
    /// tiles of 32 positions (the parts past them have none), rounded up to a power of two: a
    /// batch of short sequences then fits several blocks on an SM instead of one (on the H200, 1.5B, 64
    /// sequences at 128 to 192 positions decode 6% faster with the streamed matmul). Fewer
    /// blocks gain nothing from it, and each launch shape is one more recorded graph. Such a
    /// pass also takes `group` heads a block, which reads each K and V row once for them,
    /// where the grouped blocks still fill the SMs: every part with tiles then has a warp of
    /// its own, as the grouped kernel needs. On an H100 (SmolLM2, three heads a block, 132
    /// SMs) 64 sequences decoded 9% faster grouped (192 blocks), 32 and 48 1-3% (96 and 144),
    /// and 16 and 24 2-6% slower (48 and 72).
    fn of(
        positions: &[u32],
        heads: usize,
        warps: u32,
        split: bool,
        group: u32,
        multiprocessors: usize,
    ) -> Self {
        // Blocks past a sequence's last range exit at once, but each is still scheduled: a pass
        // gets as many as its sequence of most ranges needs, not ATTENTION_SPLITS whatever its
        // length (not always the longest: ranges are whole turns of the warps).
        let blocks_per_head = if split {
            positions
                .iter()
                .map(|&p| attention_ranges(p, warps))
                .max()
                .unwrap_or(1)
        } else {
            1
        };
        let blocks = positions.len() * heads * blocks_per_head as usize;
        let longest = positions.iter().copied().max().unwrap_or(0);
        let block_warps = if blocks > multiprocessors {
            (longest / LANES + 1).next_power_of_two().min(warps)
        } else {
            warps
        };
        // Grouped blocks that fill the SMs are more blocks than SMs before grouping too.
        let group = if blocks / group as usize >= multiprocessors {
            group
        } else {
            1
        };
        AttentionLaunch {
            blocks_per_head,
            block_warps,
            group,
            rotates_and_stores: false,
        }
    }

    /// What a pass's launches depend on ([`PassShape::variant`]).
    fn variant(self) -> u32 {
        self.blocks_per_head
            | self.block_warps << 16
            | u32::from(self.rotates_and_stores) << 24
            | self.group << 25
    }
}

#[derive(Debug)]
struct DeviceBatch<R: Runtime> {
    tokens: Buffer<R, u32>,
    positions: Buffer<R, u32>,
    table_offsets: Buffer<R, u32>,
    block_ids: Buffer<R, u32>,
    logits_rows: Buffer<R, u32>,
    cos: Buffer<R, f32>,
    sin: Buffer<R, f32>,
    /// Attention's results per range and warp of a (token, head) whose ranges have blocks of
    /// their own ([`ATTENTION_SPLITS`]): each one's maximum, sum and values, and how many blocks
    /// of the head have arrived (back to 0 once folded).
    split_parts: Buffer<R, f32>,
    split_arrivals: Buffer<R, u32>,
}

/// The checks of `rope_store_kv`'s arguments, whichever kernel does its work; the rotary
/// dimensions.
fn check_rope_store_kv<R: Runtime>(
    q: &GpuActivations<R>,
    k: &GpuActivations<R>,
    v: &GpuActivations<R>,
    cache: &GpuKvCache<R>,
    layer: usize,
    batch: &GpuBatch<R>,
    head_dim: usize,
) -> Result<usize, Error> {
    let rotary_dims = batch.rope.rotary_dims;
    checks::rope(&batch.host, q.dims(), head_dim, rotary_dims)?;
    checks::rope(&batch.host, k.dims(), head_dim, rotary_dims)?;
    checks::store_kv(&cache.layout, layer, &batch.host, k.dims(), v.dims())?;
    Ok(rotary_dims)
}

/// Whether a pass's attention rotates q and k and stores K and V itself, doing `rope_store_kv`'s
/// work: where each of the batch's tokens is its sequence's only one (a decode step), and, when
/// prompt rows take their own attention kernel (`prompt_rows_apart`, the `prompt_attention`
/// tuning), none is a prompt token: that kernel reads K and V from the cache alone. One token
/// per sequence is checked as the tokens' sequences strictly increasing, the order the engine
/// pushes them in; a batch in another order is taken as having several.
fn rotates_and_stores(batch: &RaggedBatch, prompt_rows_apart: bool) -> bool {
    batch.token_seqs().windows(2).all(|w| w[0] < w[1])
        && !(prompt_rows_apart && batch.prompt_tokens() > 0)
}

/// `argmax_rows`' buffers: each chunk's best value and index, each row's count of chunks
/// done (0 between launches), and each row's result.
struct ArgmaxBuffers<R: Runtime> {
    chunk_values: Option<Buffer<R, f32>>,
    chunk_indices: Option<Buffer<R, u32>>,
    arrivals: Option<Buffer<R, u32>>,
    best: Option<Buffer<R, u32>>,
}

/// The kernels' `int` for a size the checks bounded.
fn int(value: usize) -> KernelArg {
    KernelArg::I32(value as i32)
}

impl<R: Runtime> Backend for GpuBackend<R> {
    type Matrix = GpuMatrix<R>;
    type Vector = GpuVector<R>;
    type Activations = GpuActivations<R>;
    type KvCache = GpuKvCache<R>;
    type Batch = GpuBatch<R>;
    type Recordings = GpuRecordings<R>;

    fn describe(&self) -> String {
        let tensor_cores = match (
            self.kernels.mmqs().next().is_some(),
            self.tuning.streamed_matmul,
        ) {
            (_, true) => ", tensor cores, streamed matmul",
            (true, false) => ", tensor cores",
            (false, false) => "",
        };
        let prompt_kernels = match (self.tuning.prompt_gemm, self.tuning.prompt_attention) {
            (false, false) => None,
            (true, false) => Some("GEMM"),
            (false, true) => Some("attention"),
            (true, true) => Some("GEMM and attention"),
        };
        let prompt_kernels = prompt_kernels.map_or(String::new(), |kernels| {
            let from = self.tuning.prompt_rows_from;
            format!(", prompt rows' {kernels}, prompt_rows_from = {from}")
        });
        let skipped = match self.skipped.0.as_slice() {
            [] => String::new(),
            names => format!(
                ", {} launches LEFT OUT: outputs are wrong",
                names.join(", ")
            ),
        };
        format!(
            "{} ({}{tensor_cores}{prompt_kernels}{skipped})",
            R::NAME,
            self.device
        )
    }

    fn peak_bandwidth(&self) -> Option<f64> {
        self.peak_bandwidth
    }

    // The kernels quantize activations as they write them, in two parts or the high one alone
    // (`q8.cuh`).
    const ACTIVATION_PRECISIONS: &'static [ActivationPrecision] =
        &[ActivationPrecision::Split, ActivationPrecision::Single];

    fn load_matrix(
        &self,
        file: &Arc<GgufFile>,
        name: &str,
        precision: ActivationPrecision,
        prompt_rows: bool,
    ) -> Result<GpuMatrix<R>, Error> {
        if !Self::ACTIVATION_PRECISIONS.contains(&precision) {
            return Err(Error::UnsupportedPrecision {
                backend: R::NAME,
                precision,
            });
        }
        let (view, [cols, rows]) = checks::tensor("load_matrix", file, name)?;
        let format =
            self.kernels
                .format(view.ggml_type())
                .ok_or_else(|| Error::UnsupportedType {
                    tensor: name.to_owned(),
                    ty: view.ggml_type(),
                    backend: R::NAME,
                })?;
        let bytes = view.data();
        let mut data = self.zeros(bytes.len() + MMQ_WEIGHT_PADDING, "weights")?;
        self.upload(bytes, &mut data)?;
        let row_bytes = bytes.len() / rows.max(1);
        let prompt_gemm = format.dequantize_f16.is_some()
            && prompt_rows
            && self.tuning.prompt_gemm
            && cols.is_multiple_of(GEMM_K_STEP)
            && rows > 0;
        if prompt_gemm {
            self.reserve_f16_weights(rows, cols, name)?;
        }
        Ok(GpuMatrix {
            data,
            tensor: name.to_owned(),
            precision,
            prompt_gemm,
            format,
            rows,
            cols,
            row_bytes,
        })
    }

    fn load_vector(&self, file: &Arc<GgufFile>, name: &str) -> Result<GpuVector<R>, Error> {
        let (view, [len]) = checks::tensor("load_vector", file, name)?;
        let format = WeightFormat::new(view.ggml_type(), Isa::detect()).map_err(|_| {
            Error::UnsupportedType {
                tensor: name.to_owned(),
                ty: view.ggml_type(),
                backend: R::NAME,
            }
        })?;
        let mut values = vec![0.0; len];
        format.dequantize(view.data(), &mut values);
        Ok(GpuVector {
            data: self.upload_new(&values, "weights")?,
            len,
        })
    }

    fn vector_len(&self, v: &GpuVector<R>) -> usize {
        v.len
    }

    fn matrix_shape(&self, m: &GpuMatrix<R>) -> (usize, usize) {
        (m.rows, m.cols)
    }

    fn activations(
        &self,
        rows: usize,
        cols: usize,
        usage: ActivationUse,
    ) -> Result<GpuActivations<R>, Error> {
        let len = rows.checked_mul(cols).ok_or(Error::OutOfMemory {
            what: "activations",
            bytes: u64::MAX,
        })?;
        let (precision, prompt_rows) = match usage {
            ActivationUse::Plain => (None, false),
            ActivationUse::MatmulInput {
                prompt_rows,
                precision,
            } => (Some(precision), prompt_rows),
        };
        let quantized = match precision {
            Some(precision) if cols.is_multiple_of(QUANT_GROUP) => Some(Quantized {
                precision,
                hi: self.zeros(len, "activations")?,
                lo: self.zeros(len, "activations")?,
                scales: self.zeros(2 * (len / QUANT_GROUP), "activations")?,
                sums: self.zeros(len / 16, "activations")?,
            }),
            _ => None,
        };
        let streamed = if quantized.is_some()
            && cols.is_multiple_of(MMT_SUPERBLOCK)
            && self.tuning.streamed_matmul
        {
            let (partials, counters) = streamed_scratch_len(rows, self.multiprocessors);
            Some(StreamedScratch {
                partials: self.zeros(partials, "matmul partial sums")?,
                counters: self.zeros(counters, "matmul partial sums")?,
            })
        } else {
            None
        };
        let half = if prompt_rows && self.tuning.prompt_gemm && cols.is_multiple_of(GEMM_K_STEP) {
            Some(self.zeros(len, "activations")?)
        } else {
            None
        };
        Ok(GpuActivations {
            data: self.zeros(len, "activations")?,
            rows,
            cols,
            quantized,
            quantized_rows: Cell::new(0),
            streamed,
            half,
        })
    }

    fn kv_cache(&self, layout: KvLayout) -> Result<GpuKvCache<R>, Error> {
        let per_layer = layout.layer_len().ok_or(Error::OutOfMemory {
            what: "kv cache",
            bytes: u64::MAX,
        })?;
        let layer = || self.zeros::<u16>(per_layer, "kv cache");
        let k = (0..layout.layers)
            .map(|_| layer())
            .collect::<Result<_, _>>()?;
        let v = (0..layout.layers)
            .map(|_| layer())
            .collect::<Result<_, _>>()?;
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Ok(GpuKvCache {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            layout,
            k,
            v,
        })
    }

    fn batch(
        &self,
        capacity: BatchCapacity,
        rope: Rope,
        attention: AttentionShape,
    ) -> Result<GpuBatch<R>, Error> {
        let half_rot = rope.rotary_dims / 2;
        let tables = capacity.tokens * half_rot;
        // Only passes of up to SPLIT_BLOCKS_MAX_TOKENS tokens split a head between blocks.
        let split_sizes = || {
            let heads = capacity
                .tokens
                .min(SPLIT_BLOCKS_MAX_TOKENS)
                .checked_mul(attention.heads)?;
            let values = heads
                .checked_mul((ATTENTION_SPLITS * self.tuning.attention_warps) as usize)?
                .checked_mul(attention.head_dim + 2)?;
            Some((heads, values))
        };
        let (split_heads, split_values) = split_sizes().ok_or(Error::OutOfMemory {
            what: "attention splits",
            bytes: u64::MAX,
        })?;
        Ok(GpuBatch {
            capacity,
            rope,
            host: RaggedBatch::new(),
            table_offsets: Vec::with_capacity(capacity.tokens),
            cos: vec![0.0; tables],
            sin: vec![0.0; tables],
            heads: attention.heads,
            attention_group: self.attention_group(attention),
            attention: AttentionLaunch {
                blocks_per_head: 1,
                block_warps: self.tuning.attention_warps,
                group: 1,
                rotates_and_stores: false,
            },
            device: DeviceBatch {
                tokens: self.zeros(capacity.tokens, "batch")?,
                positions: self.zeros(capacity.tokens, "batch")?,
                table_offsets: self.zeros(capacity.tokens, "batch")?,
                block_ids: self.zeros(capacity.blocks, "batch")?,
                logits_rows: self.zeros(capacity.logits, "batch")?,
                cos: self.zeros(tables, "rope table")?,
                sin: self.zeros(tables, "rope table")?,
                split_parts: self.zeros(split_values, "attention splits")?,
                split_arrivals: self.zeros(split_heads, "attention splits")?,
            },
        })
    }

    fn set_batch(&self, dst: &mut GpuBatch<R>, src: &RaggedBatch) -> Result<u32, Error> {
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
        dst.attention = AttentionLaunch {
            rotates_and_stores: rotates_and_stores(src, self.tuning.prompt_attention),
            ..AttentionLaunch::of(
                src.positions(),
                dst.heads,
                self.tuning.attention_warps,
                src.len() <= SPLIT_BLOCKS_MAX_TOKENS,
                dst.attention_group,
                self.multiprocessors,
            )
        };
        Ok(dst.attention.variant())
    }

    fn recordings(&self) -> GpuRecordings<R> {
        GpuRecordings {
            graphs: HashMap::new(),
        }
    }

    fn run_pass<F>(
        &self,
        recordings: &mut GpuRecordings<R>,
        shape: PassShape,
        cache: &mut GpuKvCache<R>,
        enqueue: F,
    ) -> Result<(), Error>
    where
        F: FnOnce(&mut GpuKvCache<R>) -> Result<(), Error>,
    {
        let key = (shape, cache.id);
        if !self.graphs
            || shape.tokens > RECORD_MAX_TOKENS
            || (recordings.graphs.len() >= RECORD_MAX_GRAPHS
                && !recordings.graphs.contains_key(&key))
        {
            return self.overlapping(shape, || enqueue(cache));
        }
        let graph = match recordings.graphs.entry(key) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                // A graph keeps each launch as it was recorded, overlap included.
                let graph = self.overlapping(shape, || self.record(cache, enqueue))?;
                self.passes_recorded.fetch_add(1, Ordering::Relaxed);
                entry.insert(graph)
            }
        };
        self.runtime
            .replay(graph)
            .map_err(device_error::<R>("replay"))
    }

    fn prompt_rows_from(&self) -> Option<usize> {
        (self.tuning.prompt_gemm || self.tuning.prompt_attention)
            .then_some(self.tuning.prompt_rows_from as usize)
    }

    fn passes_recorded(&self) -> u64 {
        self.passes_recorded.load(Ordering::Relaxed)
    }

    fn synchronize(&self) -> Result<(), Error> {
        self.runtime
            .synchronize()
            .map_err(device_error::<R>("synchronize"))
    }

    fn embed(
        &self,
        table: &GpuMatrix<R>,
        batch: &GpuBatch<R>,
        out: &mut GpuActivations<R>,
    ) -> Result<(), Error> {
        checks::embed(&batch.host, (table.rows, table.cols), out.dims())?;
        let tokens = batch.host.tokens();
        self.launch(
            "embed",
            &table.format.get_rows,
            tokens.len() as u32,
            ROW_THREADS,
            &[
                table.data.arg(),
                (table.row_bytes as u64).into(),
                int(table.cols),
                batch.device.tokens.arg(),
                out.written(),
            ],
        )
    }

    fn rms_norm(
        &self,
        x: &GpuActivations<R>,
        weight: &GpuVector<R>,
        eps: f32,
        rows: usize,
        out: &mut GpuActivations<R>,
    ) -> Result<(), Error> {
        checks::rms_norm(rows, x.dims(), weight.len, out.dims())?;
        self.norm_rows(x.data.arg(), NULL, weight, eps, rows, out)
    }

    fn add_rms_norm(
        &self,
        x: &mut GpuActivations<R>,
        y: &GpuActivations<R>,
        weight: &GpuVector<R>,
        eps: f32,
        rows: usize,
        out: &mut GpuActivations<R>,
    ) -> Result<(), Error> {
        checks::elementwise("add", rows, x.dims(), y.dims())?;
        checks::rms_norm(rows, x.dims(), weight.len, out.dims())?;
        self.norm_rows(x.written(), y.data.arg(), weight, eps, rows, out)
    }

    fn rms_norm_heads(
        &self,
        x: &mut GpuActivations<R>,
        weight: &GpuVector<R>,
        eps: f32,
        rows: usize,
    ) -> Result<(), Error> {
        let head_dim = weight.len;
        checks::rms_norm_heads(rows, x.dims(), head_dim)?;
        let heads = rows * x.cols / head_dim;
        let grid = (heads as u32).div_ceil(WARPS_PER_BLOCK);
        self.launch(
            "rms_norm_heads",
            &self.kernels.rms_norm_heads,
            grid,
            WARPS_PER_BLOCK * LANES,
            &[
                x.written(),
                weight.data.arg(),
                eps.into(),
                int(head_dim),
                int(heads),
            ],
        )
    }

    fn matmul(
        &self,
        matrix: &GpuMatrix<R>,
        bias: Option<&GpuVector<R>>,
        x: &GpuActivations<R>,
        rows: Rows,
        out: &mut GpuActivations<R>,
    ) -> Result<(), Error> {
        self.matmuls(x, rows, &mut [Projection { matrix, bias, out }])
    }

    fn matmuls(
        &self,
        x: &GpuActivations<R>,
        rows: Rows,
        projections: &mut [Projection<'_, Self>],
    ) -> Result<(), Error> {
        for p in projections.iter() {
            checks::matmul(
                rows,
                (p.matrix.rows, p.matrix.cols),
                p.bias.map(|b| b.len),
                x.dims(),
                p.out.dims(),
            )?;
        }
        if projections
            .first()
            .is_some_and(|p| self.skipped.matmul(&p.matrix.tensor))
        {
            return Ok(());
        }
        // Prompt rows through the GEMM where every matrix takes it (which depends on the
        // matrices alone, so a row's class never depends on its pass), the rest after them
        // through the int8 kernels. The activations have their f16 copy wherever the matrices
        // take the GEMM, unless they were allocated for no prompt rows.
        if rows.prompt > 0 && x.half.is_none() && projections.iter().any(|p| p.matrix.prompt_gemm) {
            return Err(Error::Shape {
                op: "matmul",
                detail: "prompt rows from activations allocated for none \
                         (ActivationUse::MatmulInput { prompt_rows: false })"
                    .to_owned(),
            });
        }
        let gemm_rows = match (&self.kernels.prompt_gemm, &x.half) {
            (Some(gemm), Some(half))
                if rows.prompt > 0 && projections.iter().all(|p| p.matrix.prompt_gemm) =>
            {
                self.prompt_gemm(gemm, x, half, rows.prompt, projections)?;
                rows.prompt
            }
            _ => 0,
        };
        let (first_row, rows) = (gemm_rows, rows.total - gemm_rows);
        if rows == 0 {
            return Ok(());
        }
        let mut rest = projections;
        while let Some(first) = rest.first() {
            // Matrices launched together share one format (and so, with the width checked
            // above, one row length).
            // Whether the instance takes several matrices does not depend on their rows.
            let (_, launch) = self.matvec_instance(
                &first.matrix.format,
                rows,
                first.matrix.cols,
                first.matrix.rows,
            );
            let candidates = &rest[..rest.len().min(MATVEC_PARTS)];
            let together = if self.streamed_mixed(candidates).is_some()
                || self.mixed_matvec(rows, candidates).is_some()
            {
                MATVEC_PARTS
            } else if matches!(
                launch,
                MatvecLaunch::Parts
                    | MatvecLaunch::Pairs
                    | MatvecLaunch::Streamed
                    | MatvecLaunch::StreamedRow
            ) {
                rest.iter()
                    .take(MATVEC_PARTS)
                    .take_while(|p| Arc::ptr_eq(&p.matrix.format, &first.matrix.format))
                    .count()
            } else {
                1
            };
            let (launch, tail) = rest.split_at_mut(together);
            self.matvec(x, first_row, rows, launch)?;
            rest = tail;
        }
        Ok(())
    }

    fn rope(
        &self,
        x: &mut GpuActivations<R>,
        batch: &GpuBatch<R>,
        head_dim: usize,
    ) -> Result<(), Error> {
        let rotary_dims = batch.rope.rotary_dims;
        checks::rope(&batch.host, x.dims(), head_dim, rotary_dims)?;
        let rows = batch.host.len();
        let neox = i32::from(batch.rope.style == RopeStyle::Neox);
        let cols = x.cols;
        self.launch(
            "rope",
            &self.kernels.rope,
            rows as u32,
            ROW_THREADS,
            &[
                x.written(),
                batch.device.cos.arg(),
                batch.device.sin.arg(),
                int(cols),
                int(head_dim),
                int(rotary_dims),
                neox.into(),
            ],
        )
    }

    fn store_kv(
        &self,
        cache: &mut GpuKvCache<R>,
        layer: usize,
        k: &GpuActivations<R>,
        v: &GpuActivations<R>,
        batch: &GpuBatch<R>,
    ) -> Result<(), Error> {
        let l = cache.layout;
        checks::store_kv(&l, layer, &batch.host, k.dims(), v.dims())?;
        let rows = batch.host.len();
        let d = &batch.device;
        self.launch(
            "store_kv",
            &self.kernels.store_kv,
            rows as u32,
            ROW_THREADS,
            &[
                k.data.arg(),
                v.data.arg(),
                d.positions.arg(),
                d.table_offsets.arg(),
                d.block_ids.arg(),
                int(l.block_tokens),
                int(l.kv_heads * l.head_dim),
                cache.k[layer].arg(),
                cache.v[layer].arg(),
            ],
        )
    }

    fn rope_store_kv(
        &self,
        q: &mut GpuActivations<R>,
        k: &mut GpuActivations<R>,
        v: &GpuActivations<R>,
        cache: &mut GpuKvCache<R>,
        layer: usize,
        batch: &GpuBatch<R>,
        head_dim: usize,
    ) -> Result<(), Error> {
        let rotary_dims = check_rope_store_kv(q, k, v, cache, layer, batch, head_dim)?;
        let l = cache.layout;
        let rows = batch.host.len();
        let neox = i32::from(batch.rope.style == RopeStyle::Neox);
        let (q_cols, kv_cols) = (q.cols, k.cols);
        let d = &batch.device;
        // A thread per pair of q and k that rotates, as the kernel wants, within a block's most.
        let pairs = (q_cols + kv_cols) / head_dim * (rotary_dims / 2);
        self.launch(
            "rope_store_kv",
            &self.kernels.rope_store_kv,
            rows as u32,
            (pairs as u32)
                .next_multiple_of(LANES)
                .clamp(LANES, ROPE_STORE_MAX_THREADS),
            &[
                q.written(),
                k.written(),
                v.data.arg(),
                d.cos.arg(),
                d.sin.arg(),
                int(q_cols),
                int(kv_cols),
                int(head_dim),
                int(rotary_dims),
                neox.into(),
                d.positions.arg(),
                d.table_offsets.arg(),
                d.block_ids.arg(),
                int(l.block_tokens),
                cache.k[layer].arg(),
                cache.v[layer].arg(),
            ],
        )
    }

    fn attention(
        &self,
        q: &GpuActivations<R>,
        cache: &GpuKvCache<R>,
        layer: usize,
        batch: &GpuBatch<R>,
        shape: AttentionShape,
        out: &mut GpuActivations<R>,
    ) -> Result<(), Error> {
        self.launch_attention(q, None, cache, layer, batch, shape, out)
    }

    fn attend(
        &self,
        q: &mut GpuActivations<R>,
        k: &mut GpuActivations<R>,
        v: &GpuActivations<R>,
        cache: &mut GpuKvCache<R>,
        layer: usize,
        batch: &GpuBatch<R>,
        shape: AttentionShape,
        out: &mut GpuActivations<R>,
    ) -> Result<(), Error> {
        if !batch.attention.rotates_and_stores {
            self.rope_store_kv(q, k, v, cache, layer, batch, shape.head_dim)?;
            return self.attention(q, cache, layer, batch, shape, out);
        }
        check_rope_store_kv(q, k, v, cache, layer, batch, shape.head_dim)?;
        self.launch_attention(q, Some((k, v)), cache, layer, batch, shape, out)
    }

    fn silu_mul(
        &self,
        gate: &mut GpuActivations<R>,
        up: &GpuActivations<R>,
        rows: usize,
    ) -> Result<(), Error> {
        checks::elementwise("silu_mul", rows, gate.dims(), up.dims())?;
        let n = (rows * gate.cols) as u64;
        let (gate, quantized) = gate.written_quantized(rows);
        self.launch(
            "silu_mul",
            &self.kernels.silu_mul,
            elementwise_grid(n),
            ROW_THREADS,
            &[gate, up.data.arg(), n.into(), quantized],
        )
    }

    fn add(
        &self,
        x: &mut GpuActivations<R>,
        y: &GpuActivations<R>,
        rows: usize,
    ) -> Result<(), Error> {
        checks::elementwise("add", rows, x.dims(), y.dims())?;
        let n = (rows * x.cols) as u64;
        self.launch(
            "add",
            &self.kernels.add,
            elementwise_grid(n),
            ROW_THREADS,
            &[x.written(), y.data.arg(), n.into()],
        )
    }

    fn gather_logits_rows(
        &self,
        x: &GpuActivations<R>,
        batch: &GpuBatch<R>,
        out: &mut GpuActivations<R>,
    ) -> Result<(), Error> {
        checks::gather_logits_rows(&batch.host, x.dims(), out.dims())?;
        let wanted = batch.host.logits_rows();
        self.launch(
            "gather_logits_rows",
            &self.kernels.gather_rows,
            wanted.len() as u32,
            ROW_THREADS,
            &[
                x.data.arg(),
                batch.device.logits_rows.arg(),
                int(x.cols),
                out.written(),
            ],
        )
    }

    fn read_rows(&self, x: &GpuActivations<R>, rows: usize, out: &mut [f32]) -> Result<(), Error> {
        checks::read_rows(rows, x.dims(), out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        self.download("read_rows", &x.data, out)
    }

    fn argmax_rows(&self, x: &GpuActivations<R>, out: &mut [u32]) -> Result<(), Error> {
        checks::rows("argmax_rows", out.len(), x.rows)?;
        if out.is_empty() {
            return Ok(());
        }
        let rows = out.len();
        let chunks = x.cols.div_ceil(ARGMAX_CHUNK).max(1);
        let mut guard = self.argmax.lock().unwrap_or_else(|e| e.into_inner());
        let buffers = &mut *guard;
        let values = sample::at_least(self, &mut buffers.chunk_values, rows * chunks, "argmax")?;
        let indices = sample::at_least(self, &mut buffers.chunk_indices, rows * chunks, "argmax")?;
        let arrivals = sample::at_least(self, &mut buffers.arrivals, rows, "argmax")?;
        let best = sample::at_least(self, &mut buffers.best, rows, "argmax")?;
        self.launch(
            "argmax_rows",
            &self.kernels.argmax_rows,
            (rows * chunks) as u32,
            ROW_THREADS,
            &[
                x.data.arg(),
                int(x.cols),
                int(chunks),
                values.arg(),
                indices.arg(),
                arrivals.arg(),
                best.arg(),
            ],
        )?;
        self.download("argmax_rows", best, out)
    }

    fn samples_rows(&self) -> bool {
        self.samples_rows
    }

    fn sample_rows(
        &self,
        x: &mut GpuActivations<R>,
        rows: &[crate::RowSampling],
        penalised: &[(u32, u32)],
        out: &mut [Option<u32>],
    ) -> Result<(), Error> {
        self.sample_on_device(x, rows, penalised, out)
    }
}

/// How a matvec instance is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MatvecLaunch {
    /// Over up to [`MATVEC_PARTS`] matrices of one format, one warp per row.
    Parts,
    /// As `Parts`, two rows per warp ([`matvec_pairs`]).
    Pairs,
    /// Over one matrix, one warp per row.
    Alone,
    /// Over one matrix, each row cut into `pieces` of `piece_spans` spans, one warp each.
    Split { pieces: u32, piece_spans: u32 },
    /// Over one matrix on the tensor cores, `tile_rows` activation rows per block, adding the
    /// pieces of `split_spans` spans (0: rows are not split) as the split matvec does.
    Tiles { tile_rows: u32, split_spans: u32 },
    /// Over up to [`MATVEC_PARTS`] matrices of one format on the tensor cores, streamed
    /// (`GpuBackend::streamed_matmul`).
    Streamed,
    /// As `Streamed` for up to [`MMT_ROW_MAX_ROWS`] activation rows, through its one-row kernel
    /// of the same bits.
    StreamedRow,
}

/// `parts` as three matrices of which the first two share a format and the third is in
/// another: the launches that mix formats ([`GpuBackend::mixed_matvec`],
/// [`GpuBackend::streamed_mixed`]).
fn mixed_formats<'p, 'f, R: Runtime>(
    parts: &'p [Projection<'f, GpuBackend<R>>],
) -> Option<[&'p Projection<'f, GpuBackend<R>>; 3]> {
    let [first, second, third] = parts else {
        return None;
    };
    let format = &first.matrix.format;
    (Arc::ptr_eq(format, &second.matrix.format) && !Arc::ptr_eq(format, &third.matrix.format))
        .then_some([first, second, third])
}

/// A format's kernels for a third matrix in format `third` (`mmv1_mixed`, `Streamed::mixed`),
/// where the images have them.
fn paired<T>(kernels: &[(GgmlType, T)], third: GgmlType) -> Option<&T> {
    kernels
        .iter()
        .find(|(ty, _)| *ty == third)
        .map(|(_, kernel)| kernel)
}

/// The kernels a streamed matmul launch chooses from.
#[derive(Clone, Copy)]
enum StreamedKernels<'f, F> {
    /// Its matrices' format's.
    Format(&'f Streamed<F>),
    /// A pair of formats' ([`GpuBackend::streamed_mixed`]).
    Mixed(&'f StreamedMixed<F>),
}

/// The arguments of the kernels that take up to [`MATVEC_PARTS`] matrices (`MatvecPart`s of
/// kernels/cuda/qspan.cuh): each one's data, rows, bias and output from row `first` on, absent
/// ones empty.
fn parts_args<R: Runtime>(
    parts: &mut [Projection<'_, GpuBackend<R>>],
    first: usize,
) -> Vec<KernelArg> {
    let mut args = Vec::with_capacity(4 * MATVEC_PARTS + 10);
    for i in 0..MATVEC_PARTS {
        match parts.get_mut(i) {
            Some(Projection { matrix, bias, out }) => {
                args.extend([
                    matrix.data.arg(),
                    int(matrix.rows),
                    bias.map_or(NULL, |bias| bias.data.arg()),
                    out.written_from(first),
                ]);
            }
            None => args.extend([NULL, int(0), NULL, NULL]),
        }
    }
    args
}

/// The index in [`GEMM_TILES`] of the f16 GEMM's tile for `rows` prompt rows times
/// `weight_rows`: 128 weight rows for the wide matrices (gate and up) and for long passes, 128
/// prompt rows for long passes and for the wide matrices past one tile. Every tile gives a row
/// the same bits. On an H100 (`tests/cuda/gemm/bench.cu`) this choice was within 3% of the
/// fastest tile for each of the 1.5B's matrices at 128, 512 and 2,048 rows.
fn gemm_tile(rows: usize, weight_rows: usize) -> usize {
    let long = rows >= 1024;
    let wide = weight_rows >= 8192;
    let tile = (
        if long || (wide && rows > 64) { 128 } else { 64 },
        if long || wide { 128 } else { 64 },
    );
    GEMM_TILES
        .iter()
        .position(|&t| t == tile)
        .expect("every tile shape is an instance")
}

/// How many ranges the streamed matmul cuts each row's `superblocks` into for a launch of
/// `row_blocks` blocks of [`MMT_WEIGHT_ROWS`] rows: doubling while the launch has fewer blocks
/// than the device has `multiprocessors` and each range keeps a super-block; then, where that
/// leaves ranges longer than one turn of the one-row kernel ([`MMT_TURN_SUPERBLOCKS`]), ranges
/// of exactly one turn, where they fit [`MMT_MAX_SPLIT`] and the scratch
/// ([`streamed_scratch_len`]). Eight ranges of the 1.5B's down projection (35 super-blocks)
/// took five each, so each warp of the one-row kernel waited on memory twice and ran its second
/// turn a quarter full; in nine of four, a turn each, the projection cost 216–235 µs of a decode
/// step instead of 273 (`tests/gpu/ablate`), and an H100 decoded at 821–842 tok/s against
/// 790–798 (`bench --chip rtx3090 --batch 1,4,16,64 --prompt-tokens 128 --gen-tokens 64`,
/// alternated): 4 sequences 2–3% faster, 16 1–2% slower (their tiles, in nine ranges too), 64
/// level. The order in which a row's sum is added depends on the split, so it depends on the
/// matrices and the device alone, never on the activation rows.
fn streamed_split(row_blocks: usize, superblocks: usize, multiprocessors: usize) -> usize {
    let mut ksplit = 1;
    while ksplit < MMT_MAX_SPLIT
        && 2 * ksplit <= superblocks
        && row_blocks * ksplit < multiprocessors
    {
        ksplit *= 2;
    }
    let turns = superblocks.div_ceil(MMT_TURN_SUPERBLOCKS);
    if ksplit > 1
        && turns > ksplit
        && superblocks.div_ceil(turns) == MMT_TURN_SUPERBLOCKS
        && turns <= MMT_MAX_SPLIT
        && row_blocks * turns < MMT_SCRATCH_RANGES_PER_SM * multiprocessors
    {
        return turns;
    }
    ksplit
}

/// Activation rows per tile of a streamed matmul pass over `rows` whose launch has `blocks`
/// blocks per tile (row blocks times ranges): wide tiles past a narrow tile's worth of rows
/// where the narrow tiles would give every SM at least [`MMT_WIDE_MIN_BLOCKS_PER_SM`] blocks,
/// so that halving them still fills the GPU; narrow ones elsewhere.
fn streamed_tile_rows(rows: usize, blocks: usize, multiprocessors: usize) -> usize {
    if rows > MMT_TILE_ROWS
        && rows.div_ceil(MMT_TILE_ROWS) * blocks >= MMT_WIDE_MIN_BLOCKS_PER_SM * multiprocessors
    {
        MMT_WIDE_TILE_ROWS
    } else {
        MMT_TILE_ROWS
    }
}

/// The partial sums and counters a streamed matmul over `rows` activation rows needs at most,
/// whatever its matrices ([`streamed_split`]): with ranges, a launch has fewer row blocks than
/// `multiprocessors`, and fewer than [`MMT_SCRATCH_RANGES_PER_SM`] times that many row blocks
/// times ranges.
fn streamed_scratch_len(rows: usize, multiprocessors: usize) -> (usize, usize) {
    // Narrow tiles' rows, or wide tiles' (as many or more).
    let tiled_rows = rows.div_ceil(MMT_WIDE_TILE_ROWS) * MMT_WIDE_TILE_ROWS;
    (
        tiled_rows * MMT_SCRATCH_RANGES_PER_SM * multiprocessors * MMT_WEIGHT_ROWS,
        rows.div_ceil(MMT_TILE_ROWS) * multiprocessors,
    )
}

/// How a quantized matvec cuts weight rows of `cols` columns between warps: the pieces and the
/// spans of each, or `None` for one warp per row. It depends on the width alone, so that every
/// instance adds a row's products in the same order.
fn matvec_split(cols: usize) -> Option<(u32, u32)> {
    let spans = cols / QUANT_GROUP;
    if spans <= MATVEC_SPLIT_SPANS {
        return None;
    }
    let piece_spans = spans.div_ceil(spans.div_ceil(MATVEC_SPLIT_SPANS).min(MATVEC_MAX_SPLIT));
    // As the kernel counts them.
    let pieces = spans.div_ceil(piece_spans);
    Some((pieces as u32, piece_spans as u32))
}

/// Whether the one-row matvec takes `weight_rows` rows of `cols` columns two per warp
/// (`mmv_q8_pairs`): rows of 32k + 16 spans, whose last turn leaves half of a warp's lanes
/// idle, and which as pairs fall to the same lanes in the same order (the kernel says why), in
/// launches of at least [`MATVEC_PAIRS_MIN_ROWS`]. Split rows never are. Either way a row gets
/// the same bits.
fn matvec_pairs(cols: usize, weight_rows: usize) -> bool {
    let spans = cols / QUANT_GROUP;
    spans <= MATVEC_SPLIT_SPANS
        && spans % LANES as usize == LANES as usize / 2
        && weight_rows >= MATVEC_PAIRS_MIN_ROWS
}

/// Whether the streamed matmul's one-row kernel takes rows of `superblocks` super-blocks cut
/// into `ksplit` ranges a warp per row, two ranges a turn (`mmt_ranges_<format>`): where the
/// rows are cut and each range has at most two super-blocks, which would leave half of a
/// warp per range idle. Either way a row gets the same bits.
fn streamed_short_ranges(superblocks: usize, ksplit: usize) -> bool {
    ksplit > 1 && superblocks.div_ceil(ksplit) <= 2
}

/// Whether the streamed matmul's one-row kernel takes `weight_rows` rows of `superblocks`
/// super-blocks, cut into `ksplit` ranges, two per warp (`mmt_pair_<format>`): rows not cut,
/// of 4k + 2 super-blocks, whose last turn leaves half of a warp's lanes idle, in launches of
/// at least [`MATVEC_PAIRS_MIN_ROWS`], as the matvec pairs its rows. Either way a row gets the
/// same bits.
fn streamed_pairs(superblocks: usize, ksplit: usize, weight_rows: usize) -> bool {
    ksplit == 1 && superblocks % 4 == 2 && weight_rows >= MATVEC_PAIRS_MIN_ROWS
}

/// Blocks for a grid-stride loop over `n` elements.
fn elementwise_grid(n: u64) -> u32 {
    n.div_ceil(u64::from(ROW_THREADS)).min(4096) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_cuts_positions_into_at_most_eight_ranges_of_whole_turns_of_the_warps() {
        for warps in 1..=16 {
            for position in 0..20_000 {
                let ranges = attention_ranges(position, warps);
                assert!((1..=ATTENTION_SPLITS).contains(&ranges));
                // One range while every warp has at most one tile.
                assert_eq!(ranges == 1, position / LANES < warps, "{position} {warps}");
            }
        }
        // 1,100 positions (35 tiles): ranges of 16 tiles at 16 warps, of 6 at 3.
        assert_eq!(attention_ranges(1_099, 16), 3);
        assert_eq!(attention_ranges(1_099, 3), 6);
        // Past 4,096 positions at 16 warps the ranges grow to 32 tiles.
        assert_eq!(attention_ranges(4_095, 16), 8);
        assert_eq!(attention_ranges(4_096, 16), 5);
    }

    #[test]
    fn attention_runs_fewer_warps_per_block_only_for_short_sequences_beyond_a_wave() {
        let launch =
            |positions: &[u32], split| AttentionLaunch::of(positions, 12, 16, split, 3, 132);
        // 64 sequences of 96 to 159 positions: at most 5 tiles, so 8 warps take the 16 parts,
        // three heads a block.
        let short: Vec<u32> = (0..64).map(|i| 96 + i).collect();
        let of_short = launch(&short, false);
        assert_eq!(
            (
                of_short.blocks_per_head,
                of_short.block_warps,
                of_short.group
            ),
            (1, 8, 3)
        );
        // Four of them are 48 blocks, one head each on 132 SMs; sixteen are 192, but 64 grouped.
        let few = launch(&short[..4], true);
        assert_eq!((few.block_warps, few.group), (16, 1));
        let sixteen = launch(&short[..16], false);
        assert_eq!((sixteen.block_warps, sixteen.group), (4, 1));
        // One sequence of 1,100 positions among short ones: every part has tiles; 288 blocks,
        // 96 grouped.
        let mixed = launch(&[1_099, 39, 299, 39, 39, 39, 39, 39], true);
        assert_eq!(
            (mixed.blocks_per_head, mixed.block_warps, mixed.group),
            (3, 16, 1)
        );
        // The ranges are those of the sequence that has most, not of the longest.
        assert_eq!(launch(&[4_095, 4_096], true).blocks_per_head, 8);
        // Never more warps than parts.
        assert_eq!(
            AttentionLaunch::of(&short, 12, 3, false, 1, 132).block_warps,
            3
        );
        assert_eq!(
            AttentionLaunch::of(&short[..1], 12, 3, false, 1, 1).block_warps,
            3
        );
        assert_eq!(
            AttentionLaunch::of(&[31; 64], 12, 3, false, 1, 132).block_warps,
            1
        );
        // A grouped launch gives every part with tiles a warp of its own (the kernel traps
        // otherwise): all the parts, or at least as many warps as any block has tiles.
        for (positions, warps) in [
            (vec![1_099; 20], 16),
            (vec![1_099; 20], 3),
            ((0..64).map(|i| 30 * i).collect::<Vec<u32>>(), 16),
            (vec![200; 16], 16),
            (vec![4_095; 3], 5),
        ] {
            let of = AttentionLaunch::of(&positions, 12, warps, positions.len() <= 8, 2, 8);
            assert_eq!(of.group, 2);
            let most_tiles = positions.iter().max().unwrap() / LANES + 1;
            assert!(of.block_warps == warps || of.block_warps >= most_tiles);
        }
        // Passes that differ in any of the launch's choices differ in their recorded graphs.
        let variants: std::collections::HashSet<u32> = [(1, 5), (5, 1), (3, 16), (16, 3)]
            .into_iter()
            .flat_map(|(blocks_per_head, block_warps)| {
                [(false, 1), (true, 1), (false, 3), (true, 4)].map(|(rotates_and_stores, group)| {
                    AttentionLaunch {
                        blocks_per_head,
                        block_warps,
                        group,
                        rotates_and_stores,
                    }
                    .variant()
                })
            })
            .collect();
        assert_eq!(variants.len(), 16);
    }

    #[test]
    fn attention_stores_k_and_v_itself_only_where_each_sequence_has_one_token() {
        let batch = |tokens: &[usize], role| {
            let mut batch = RaggedBatch::new();
            for seq in 0..3 {
                batch.push_sequence(&[seq]);
            }
            for (i, &seq) in tokens.iter().enumerate() {
                batch.push_token(seq, 0, i as u32, role, true);
            }
            batch
        };
        let generated = |tokens: &[usize]| batch(tokens, crate::TokenRole::Generated);
        for prompt_rows_apart in [false, true] {
            // A decode step of three sequences, or of one.
            assert!(rotates_and_stores(
                &generated(&[0, 1, 2]),
                prompt_rows_apart
            ));
            assert!(rotates_and_stores(&generated(&[1]), prompt_rows_apart));
            // A prefill, a verify step, or sequences fed round-robin: a token's K must be
            // stored before another block reads it, so rope_store_kv runs first.
            assert!(!rotates_and_stores(&generated(&[0, 0]), prompt_rows_apart));
            assert!(!rotates_and_stores(
                &generated(&[0, 1, 0, 1]),
                prompt_rows_apart
            ));
            // One token each, in another order: taken as several, which is only slower.
            assert!(!rotates_and_stores(&generated(&[2, 0]), prompt_rows_apart));
        }
        // Prompts of one token each: their own attention kernel, where prompt rows have one,
        // reads K and V from the cache, so rope_store_kv stores them first.
        let prompts = batch(&[0, 1, 2], crate::TokenRole::Prompt);
        assert!(rotates_and_stores(&prompts, false));
        assert!(!rotates_and_stores(&prompts, true));
    }

    #[test]
    fn only_rows_wider_than_2048_columns_are_split_into_even_pieces() {
        assert_eq!(matvec_split(1536), None);
        assert_eq!(matvec_split(2048), None);
        assert_eq!(matvec_split(2080), Some((2, 33)));
        // The down projections of the 0.5B and 1.5B models.
        assert_eq!(matvec_split(4864), Some((3, 51)));
        assert_eq!(matvec_split(8960), Some((5, 56)));
        // At most MATVEC_MAX_SPLIT pieces, however wide.
        assert_eq!(matvec_split(18944), Some((8, 74)));
    }

    #[test]
    fn only_many_unsplit_rows_of_32k_plus_16_spans_go_two_per_warp() {
        // The 1.5B's gate and up projections: 48 spans, 17,920 rows.
        assert!(matvec_pairs(1536, 17920));
        assert!(matvec_pairs(512, MATVEC_PAIRS_MIN_ROWS));
        // Its q and k, o: too few rows.
        assert!(!matvec_pairs(1536, 1792));
        assert!(!matvec_pairs(1536, 1536));
        // The 0.5B's width (28 spans), SmolLM2's (18), and whole warps' worth.
        assert!(!matvec_pairs(896, 17920));
        assert!(!matvec_pairs(576, 17920));
        assert!(!matvec_pairs(1024, 17920));
        // 80 spans, but split.
        assert!(!matvec_pairs(2560, 17920));
    }

    #[test]
    fn a_streamed_matmul_s_ranges_fit_the_scratch_of_its_activations() {
        for multiprocessors in [1, 82, 132, 170] {
            for row_blocks in 1..600 {
                for superblocks in 1..48 {
                    let ksplit = streamed_split(row_blocks, superblocks, multiprocessors);
                    assert!(ksplit <= MMT_MAX_SPLIT);
                    assert!(ksplit == 1 || ksplit <= superblocks);
                    // Doubled, or cut into ranges of exactly one turn.
                    assert!(
                        ksplit.is_power_of_two()
                            || superblocks.div_ceil(ksplit) == MMT_TURN_SUPERBLOCKS
                    );
                    if ksplit == 1 {
                        continue;
                    }
                    for rows in [1, 8, 9, 17, 512] {
                        let (partials, counters) = streamed_scratch_len(rows, multiprocessors);
                        let tile_rows =
                            streamed_tile_rows(rows, ksplit * row_blocks, multiprocessors);
                        let tiles = rows.div_ceil(tile_rows);
                        let used = tiles * ksplit * row_blocks * MMT_WEIGHT_ROWS * tile_rows;
                        assert!(used <= partials && tiles * row_blocks <= counters);
                    }
                }
            }
        }
        // The 1.5B on the H200's 132 SMs: q, k and v together (32 row blocks of 6 super-blocks)
        // and o in four ranges, down (8,960 columns) in nine of one turn (doubling gave eight of
        // five super-blocks), gate and up in one.
        assert_eq!(streamed_split(32, 6, 132), 4);
        assert_eq!(streamed_split(24, 6, 132), 4);
        assert_eq!(streamed_split(24, 35, 132), 9);
        assert_eq!(streamed_split(280, 6, 132), 1);
    }

    #[test]
    fn only_many_uncut_rows_of_4k_plus_2_super_blocks_take_the_paired_one_row_kernel() {
        // The 1.5B on the H200: gate and up (17,920 rows of 6 super-blocks, not cut) and the
        // output (151,936 rows) are paired; q, k and v (cut into four ranges) and down (35
        // super-blocks, nine ranges) are not.
        let ksplit = |rows: usize, superblocks| {
            streamed_split(rows.div_ceil(MMT_WEIGHT_ROWS), superblocks, 132)
        };
        assert!(streamed_pairs(6, ksplit(17920, 6), 17920));
        assert!(streamed_pairs(6, ksplit(151_936, 6), 151_936));
        assert!(!streamed_pairs(6, ksplit(2048, 6), 2048));
        assert!(!streamed_pairs(35, ksplit(1536, 35), 1536));
        // Not cut, but too few rows; whole turns; a turn and a quarter.
        assert!(!streamed_pairs(6, 1, MATVEC_PAIRS_MIN_ROWS - 1));
        assert!(!streamed_pairs(8, 1, 17920));
        assert!(!streamed_pairs(5, 1, 17920));
    }

    #[test]
    fn rows_cut_into_ranges_of_one_or_two_super_blocks_take_a_warp_each() {
        // The 1.5B on the H200: q, k and v, and o (6 super-blocks in four ranges) do; down (35
        // in nine ranges of one turn) and uncut rows do not.
        assert!(streamed_short_ranges(6, 4));
        assert!(!streamed_short_ranges(35, 9));
        assert!(!streamed_short_ranges(6, 1));
        // Ranges of one super-block; of three.
        assert!(streamed_short_ranges(4, 4));
        assert!(!streamed_short_ranges(6, 2));
    }

    #[test]
    fn the_gemm_takes_wide_tiles_for_wide_matrices_and_long_passes() {
        let tile = |rows, weight_rows| GEMM_TILES[gemm_tile(rows, weight_rows)];
        // The 1.5B at 512 prompt rows: q, k, v and o small tiles, gate and up the largest.
        assert_eq!(tile(512, 2048), (64, 64));
        assert_eq!(tile(512, 1536), (64, 64));
        assert_eq!(tile(512, 17920), (128, 128));
        // One tile of rows: no taller; long passes: the largest for every matrix.
        assert_eq!(tile(64, 17920), (64, 128));
        assert_eq!(tile(1, 256), (64, 64));
        assert_eq!(tile(2048, 1536), (128, 128));
    }

    #[test]
    fn skipped_launches_name_kernel_families_and_matmuls_by_role() {
        let skipped = SkippedLaunches::parse(" rms_norm,,matmul:ffn_down , matmul:output");
        assert!(skipped.op("rms_norm") && !skipped.op("attention") && !skipped.op("matmul"));
        assert!(skipped.matmul("blk.0.ffn_down.weight"));
        assert!(skipped.matmul("blk.27.ffn_down.weight"));
        assert!(skipped.matmul("output.weight"));
        assert!(!skipped.matmul("blk.3.attn_output.weight"));
        assert!(!skipped.matmul("blk.3.ffn_up.weight"));
        assert!(!SkippedLaunches::parse("").matmul("output.weight"));
        assert!(!SkippedLaunches::parse("").op(""));
    }
}
