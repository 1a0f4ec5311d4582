// Quantized matrix times many activation rows on the tensor cores (prefill, batches, long verify
// steps), giving each row exactly the bits the matvec (mmv.cu) gives it.
//
// A block takes 16 weight rows and 8 * NT activation rows. A span's integer dot products are
// mma.sync m16n8k16 s8 instructions, one per run of 16 quants, activation part and tile of 8
// activation rows: integer sums are exact, so they equal the matvec's DP4A sums. The float
// steps after them then repeat the matvec's, in its order:
// - span_value (qspan.cuh) turns a span's dot products into its value;
// - the matvec's lane L adds the values of spans L, L + 32, ... of a row (or of a piece of a
//   split row) in turn, and its warp sums the 32 lanes' sums with offsets 16, 8, 4, 2, 1. Here
//   warp w of 8 takes the lanes w, w + 8, w + 16 and w + 24, each a sum in turn as there, and
//   adds them as the first two steps of that reduction do; the block adds the eight warps'
//   results as the last three do;
// - the pieces of a split row are added in order, then the bias.
// The block copies its rows to shared memory a chunk of 64 spans at a time, every thread's
// loads in flight at once, and the warps read their spans from there; the activations come
// from global memory (L1 and L2), straight into the fragments. Each block's rows are on their
// way to L2 before the kernel before it ends.
//
// On the H200 this beats the matvec from about six activation rows (README, "CUDA"): below,
// each block's chain of loads, span after span, takes longer than the matvec's many short
// warps (a profile of a two-row step puts every kernel's time in that latency; halving the
// instructions per span changed nothing). Sixteen activation rows per block beat 32: 32 hold
// 220 to 250 registers per thread, one block per SM.
//
// The mma instructions exist from sm_80; HIP builds none of this (crates/backend/build.rs),
// and its matrices take the matvec for any number of rows.

// Sub-block by sub-block: see chunk_scales_k4 (quant.cuh).
#define K4_SCALES_BY_SUB_BLOCK
#include "qspan.cuh"

#if !defined(__HIP__)

// Warps per block, each taking the lanes of one residue modulo 8.
#define MMQ_WARPS 8
// Weight rows per block: the m16 of one mma.
#define MMQ_ROWS 16
// A lane's sums per warp: 32 lanes over MMQ_WARPS warps.
#define MMQ_LANES_PER_WARP (WARP_SIZE / MMQ_WARPS)
// Spans of the block's rows in shared memory at a time: a multiple of 32, so that each chunk
// starts at lane 0 of the matvec's warp.
#define MMQ_CHUNK_SPANS 64

// c = a . b over k for a 16x16 tile of a (rows g and g + 8 of this lane's group g = lane / 4,
// columns 4t..4t+4 of t = lane % 4, four to an int) and a 16x8 tile of b (column g, rows
// 4t..4t+4): c[0], c[1] at row g, columns 2t, 2t + 1; c[2], c[3] at row g + 8.
static __device__ __forceinline__ void mma_s8(int c[4], int a_g, int a_g8, int b) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%7, %7, %7, %7};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a_g), "r"(a_g8), "r"(b), "r"(0));
}

// Int i of q, for an i known only at run time, without putting q in memory.
static __device__ __forceinline__ int pick(const int q[4], int i) {
    return i == 0 ? q[0] : i == 1 ? q[1] : i == 2 ? q[2] : q[3];
}

// The bytes of one staged weight row: a chunk of MMQ_CHUNK_SPANS spans starting anywhere in a
// block covers at most one block more than it holds, and its copy in whole 16-byte words
// starts up to 15 bytes early, to keep the row's alignment, and ends up to 30 bytes late.
template <typename Block>
__host__ __device__ constexpr int stage_row_bytes() {
    return ((MMQ_CHUNK_SPANS / (Block::QK / SPAN) + 1) * Block::BYTES + 15 + 15) / 16 * 16;
}

template <typename Block, int NT>
static __device__ void mmq(const uint8_t *w, int rows, const float *bias, float *out,
                           unsigned long long row_bytes, int cols, int split_spans,
                           const signed char *x_hi, const signed char *x_lo,
                           const float2 *x_scales, const float *x_sums, int tokens) {
    constexpr int TOKENS = 8 * NT;
    constexpr int OUTPUTS = MMQ_ROWS * TOKENS;
    constexpr int THREADS = MMQ_WARPS * WARP_SIZE;
    constexpr int OUTPUTS_PER_THREAD = (OUTPUTS + THREADS - 1) / THREADS;
    constexpr int SPANS_PER_BLOCK = Block::QK / SPAN;
    constexpr int ROW_BYTES = stage_row_bytes<Block>();
    constexpr int STAGE_BYTES = MMQ_ROWS * ROW_BYTES;
    constexpr int SUMS_BYTES = MMQ_WARPS * OUTPUTS * (int)sizeof(float);
    // The block's rows, one chunk at a time, so that a warp's spans come from shared memory
    // rather than each from global memory in turn; after a piece's last chunk the same bytes
    // hold each warp's sums of its four lanes, per output (row fastest), for the block to add.
    __shared__ __align__(16) uint8_t shared[STAGE_BYTES > SUMS_BYTES ? STAGE_BYTES : SUMS_BYTES];
    float(*warp_sums)[OUTPUTS] = (float(*)[OUTPUTS])shared;

    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int g = lane / 4, t = lane % 4;
    const int row_tiles = (rows + MMQ_ROWS - 1) / MMQ_ROWS;
    const int row0 = (blockIdx.x % row_tiles) * MMQ_ROWS;
    const int token0 = (blockIdx.x / row_tiles) * TOKENS;
    // Rows and tokens past the end read the last one's data and write nothing.
    const auto row_at = [&](int r) { return w + (size_t)min(row0 + r, rows - 1) * row_bytes; };

    START_NEXT_KERNEL();
    // The block's rows are on their way while the kernel before finishes.
    for (int r = warp; r < MMQ_ROWS; r += MMQ_WARPS) {
        prefetch_l2(row_at(r), 0, row_bytes);
    }
    WAIT_FOR_PREVIOUS_KERNEL();

    // The activation rows of this lane's B fragments (token g of each tile) and of its results
    // (tokens 2t and 2t + 1).
    int b_rows[NT], c_rows[NT][2];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        b_rows[j] = min(token0 + 8 * j + g, tokens - 1);
        c_rows[j][0] = min(token0 + 8 * j + 2 * t, tokens - 1);
        c_rows[j][1] = min(token0 + 8 * j + 2 * t + 1, tokens - 1);
    }
    const QuantizedRow x = {x_hi, x_lo, x_scales, x_sums};

    const int spans = cols / SPAN;
    const int piece_spans = split_spans > 0 ? split_spans : spans;
    float totals[OUTPUTS_PER_THREAD];
    for (int first = 0; first < spans; first += piece_spans) {
        const int last = min(first + piece_spans, spans);
        // sums[l][j][c]: lane w + 8l of the matvec's warp, for output c of tile j.
        float sums[MMQ_LANES_PER_WARP][NT][4] = {};
        for (int chunk = first; chunk < last; chunk += MMQ_CHUNK_SPANS) {
            const int chunk_end = min(chunk + MMQ_CHUNK_SPANS, last);
            // The chunk's weight blocks, bytes [from, from + bytes) of each row, copied in
            // aligned 16-byte words, the first of which starts skew(r) bytes early
            // (load_matrix pads the weights for the last row's).
            const int first_block = chunk / SPANS_PER_BLOCK;
            const size_t from = (size_t)first_block * Block::BYTES;
            const auto skew = [&](int r) { return (int)((size_t)(row_at(r) + from) % 16); };
            const int bytes =
                ((chunk_end + SPANS_PER_BLOCK - 1) / SPANS_PER_BLOCK - first_block) * Block::BYTES;
            const int row_words = (bytes + 15 + 15) / 16;
            __syncthreads();
            for (int i = threadIdx.x; i < MMQ_ROWS * row_words; i += THREADS) {
                const int r = i / row_words, word = i % row_words;
                *(int4 *)(shared + r * ROW_BYTES + 16 * word) =
                    *(const int4 *)(row_at(r) + from - skew(r) + 16 * word);
            }
            __syncthreads();
            const uint8_t *stage_g = shared + g * ROW_BYTES + skew(g);
            const uint8_t *stage_g8 = shared + (g + 8) * ROW_BYTES + skew(g + 8);
            const int col0 = first_block * Block::QK;
            // The chunk starts a multiple of 32 spans into its piece, so span chunk + 8m + w
            // is lane w + 8 (m % 4)'s.
#pragma unroll
            for (int m = 0; m < MMQ_CHUNK_SPANS / MMQ_WARPS; m++) {
                const int s = chunk + MMQ_WARPS * m + warp;
                if (s >= chunk_end) {
                    break;
                }
                const int staged = s - first_block * SPANS_PER_BLOCK;
                QSpan sp_g = qspan<Block>(stage_g, staged), sp_g8 = qspan<Block>(stage_g8, staged);
                sp_g.first += col0;
                sp_g.second += col0;
                sp_g8.first = sp_g.first;
                sp_g8.second = sp_g.second;
                const int a_lo_g = pick(sp_g.lo, t), a_lo_g8 = pick(sp_g8.lo, t);
                const int a_hi_g = pick(sp_g.hi, t), a_hi_g8 = pick(sp_g8.hi, t);
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const QuantizedRow b = activation_row(x, cols, b_rows[j]);
                    int lo_hi[4], lo_lo[4], hi_hi[4], hi_lo[4];
                    mma_s8(lo_hi, a_lo_g, a_lo_g8, *(const int *)(b.hi + sp_g.first + 4 * t));
                    mma_s8(lo_lo, a_lo_g, a_lo_g8, *(const int *)(b.lo + sp_g.first + 4 * t));
                    mma_s8(hi_hi, a_hi_g, a_hi_g8, *(const int *)(b.hi + sp_g.second + 4 * t));
                    mma_s8(hi_lo, a_hi_g, a_hi_g8, *(const int *)(b.lo + sp_g.second + 4 * t));
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        const QSpan &sp = c < 2 ? sp_g : sp_g8;
                        // The sums start at BIASED_ZERO here, not in the mma: its accumulator
                        // held in a register made prefill 1.5% slower on the H200.
                        const SpanDots dots = {BIASED_ZERO + lo_hi[c], BIASED_ZERO + lo_lo[c],
                                               BIASED_ZERO + hi_hi[c], BIASED_ZERO + hi_lo[c]};
                        sums[m % MMQ_LANES_PER_WARP][j][c] +=
                            span_value(sp, dots, activation_row(x, cols, c_rows[j][c % 2]));
                    }
                }
            }
        }
        // The staged weights are read: their bytes take the warps' sums.
        __syncthreads();
        // The matvec's first two reduction steps: lanes w and w + 16, w + 8 and w + 24.
#pragma unroll
        for (int j = 0; j < NT; j++) {
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int o = (8 * j + 2 * t + c % 2) * MMQ_ROWS + g + 8 * (c / 2);
                warp_sums[warp][o] =
                    (sums[0][j][c] + sums[2][j][c]) + (sums[1][j][c] + sums[3][j][c]);
            }
        }
        __syncthreads();
        // The last three: warps w and w + 4, then w and w + 2, then 0 and 1.
#pragma unroll
        for (int k = 0; k < OUTPUTS_PER_THREAD; k++) {
            const int o = threadIdx.x + THREADS * k;
            if (o < OUTPUTS) {
                float y[MMQ_WARPS];
#pragma unroll
                for (int v = 0; v < MMQ_WARPS; v++) {
                    y[v] = warp_sums[v][o];
                }
                const float piece = ((y[0] + y[4]) + (y[2] + y[6])) + ((y[1] + y[5]) + (y[3] + y[7]));
                totals[k] = first == 0 ? piece : totals[k] + piece;
            }
        }
    }
#pragma unroll
    for (int k = 0; k < OUTPUTS_PER_THREAD; k++) {
        const int o = threadIdx.x + THREADS * k;
        const int row = row0 + o % MMQ_ROWS, token = token0 + o / MMQ_ROWS;
        if (o < OUTPUTS && row < rows && token < tokens) {
            out[(size_t)token * rows + row] = totals[k] + (bias ? bias[row] : 0.0f);
        }
    }
}

// The tensor-core matmul of `Block` for 8 * NT activation rows per block, as `symbol`.
#define MMQ_INSTANCE(symbol, Block, NT)                                                        \
    extern "C" __global__ void __launch_bounds__(MMQ_WARPS *WARP_SIZE) symbol(                 \
        const uint8_t *w, int rows, const float *bias, float *out,                             \
        unsigned long long row_bytes, int cols, int split_spans, const signed char *x_hi,      \
        const signed char *x_lo, const float2 *x_scales, const float *x_sums, int tokens) {    \
        mmq<Block, NT>(w, rows, bias, out, row_bytes, cols, split_spans, x_hi, x_lo,           \
                       x_scales, x_sums, tokens);                                              \
    }
#define MMQ_INSTANCES(name, Block)       \
    MMQ_INSTANCE(mmq8_##name, Block, 1) \
    MMQ_INSTANCE(mmq16_##name, Block, 2)
FOR_EACH_QUANT_FORMAT(MMQ_INSTANCES)

#endif
