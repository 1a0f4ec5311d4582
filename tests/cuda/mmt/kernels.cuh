// Candidate matmuls for every pass of a Q4_K matrix on the tensor cores beside the one the
// backend runs (kernels/cuda/mmt.cu, `mmt_q4_k`, called mmt2 here), measured by bench.cu (the
// README's "Tensor cores for every pass" says what they showed):
//
// - mmt4: mmt2's streaming block with activations in groups of 256 (quantize_q8_256), integer
//   sums per super-block and one float expression per super-block (superblock_value);
// - mmt5: mmt4's products, the work dealt out in equal ranges to a fixed grid (stream-K);
// - mmv256: a one-row matvec on mmt4's activations that gives mmt4's bits.
//
// Each computes a row the same way whatever the other activation rows of the pass.
#pragma once

#include "../../../kernels/cuda/mmt.cu"
#include "../../../kernels/cuda/q8.cuh"

// The stages of mmt5 (dynamic shared memory, sized at launch).
extern __shared__ __align__(16) uint8_t smem[];

// mmt4: mmt2 with activations quantized per 256 values (one (d_hi, d_lo) per super-block, and
// the integer sum of each part per sub-block of 32), as the CPU quantizes them for the
// K-quants: a sub-block's integer sums are scaled by its integer scale and added in integers,
// and the float work is done once per super-block instead of once per sub-block.
#define MMT4_STRIDE_SCALES 16
#define MMT4_BSUMS_STRIDE 144
#define MMT4_SCALES (MMT_Q4_K_TILE + TileLayout<MMT_TOKENS>::X_LO + MMT_TOKENS * MMT_X_STRIDE)
#define MMT4_BSUMS (MMT4_SCALES + MMT_TOKENS * MMT4_STRIDE_SCALES)
#define MMT4_STAGE_BYTES (MMT4_BSUMS + MMT_TOKENS * MMT4_BSUMS_STRIDE)
#define MMT4_SMEM (MMT_STAGES * MMT4_STAGE_BYTES)

// Activations in 256-groups: hi, lo (tokens x cols), scales (d_hi, d_lo) per 256, and per 16
// the integer sums (of hi, of lo).
extern "C" __global__ void quantize_q8_256(const float *x, long long groups, signed char *hi,
                                           signed char *lo, float2 *scales, int2 *bsums) {
    const long long group = (long long)blockIdx.x * (blockDim.x / WARP_SIZE) +
                            threadIdx.x / WARP_SIZE;
    if (group >= groups) {
        return;
    }
    const int lane = threadIdx.x % WARP_SIZE;
    const float *v = x + group * 256 + 8 * lane;
    float amax = 0.0f;
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(v[i]));
    amax = warp_max(amax);
    const float d_hi = amax < SMALLEST_AMAX ? 0.0f : amax / 127.0f;
    int qh[8];
    float r[8], rmax = 0.0f;
    for (int i = 0; i < 8; i++) {
        qh[i] = d_hi == 0.0f ? 0 : __float2int_rn(v[i] * (127.0f / amax));
        r[i] = __fsub_rn(v[i], __fmul_rn(d_hi, (float)qh[i]));
        rmax = fmaxf(rmax, fabsf(r[i]));
    }
    rmax = warp_max(rmax);
    const float d_lo = rmax < SMALLEST_AMAX ? 0.0f : rmax / 127.0f;
    int sum_hi = 0, sum_lo = 0;
    for (int i = 0; i < 8; i++) {
        const int ql = d_lo == 0.0f ? 0 : __float2int_rn(r[i] * (127.0f / rmax));
        hi[group * 256 + 8 * lane + i] = (signed char)qh[i];
        lo[group * 256 + 8 * lane + i] = (signed char)ql;
        sum_hi += qh[i];
        sum_lo += ql;
    }
    sum_hi += SHFL_XOR(sum_hi, 1);
    sum_lo += SHFL_XOR(sum_lo, 1);
    if (lane == 0) scales[group] = make_float2(d_hi, d_lo);
    if (lane % 2 == 0) bsums[group * 16 + lane / 2] = make_int2(sum_hi, sum_lo);
}

static __device__ __forceinline__ void stage_activations_256(uint8_t *stage,
                                                             const signed char *x_hi,
                                                             const signed char *x_lo,
                                                             const float2 *x_scales,
                                                             const int2 *x_bsums, int cols,
                                                             int t0, int tokens, unsigned blk) {
    const unsigned blocks = cols / 256;
    for (int p = threadIdx.x; p < MMT_TOKENS * 32; p += blockDim.x) {
        const int tok = p / 32, part = (p / 16) % 2, piece = p % 16;
        if (t0 + tok < tokens) {
            copy16_async(stage + MMT_Q4_K_TILE + (part ? TileLayout<MMT_TOKENS>::X_LO : TileLayout<MMT_TOKENS>::X_HI) +
                             tok * MMT_X_STRIDE + 16 * piece,
                         (part ? x_lo : x_hi) + (size_t)(t0 + tok) * cols + 256 * blk +
                             16 * piece);
        }
    }
    for (int p = threadIdx.x; p < MMT_TOKENS * 9; p += blockDim.x) {
        const int tok = p / 9, piece = p % 9;
        if (t0 + tok < tokens) {
            const size_t b = (size_t)(t0 + tok) * blocks + blk;
            if (piece == 8) {
                copy8_async(stage + MMT4_SCALES + tok * MMT4_STRIDE_SCALES, x_scales + b);
            } else {
                copy16_async(stage + MMT4_BSUMS + tok * MMT4_BSUMS_STRIDE + 16 * piece,
                             x_bsums + 16 * b + 2 * piece);
            }
        }
    }
}

// A super-block's value for one weight row and activation row, from its integer sums: of the
// quants times the sub-block scales with each activation part, and of the minimums times each
// part's sums. Spelled with rounding intrinsics, so that any kernel computing it gets the same
// bits.
static __device__ __forceinline__ float superblock_value(float d, float dmin, float2 x, int ih,
                                                         int il, int mh, int ml) {
    const float dots = __fmaf_rn(x.x, __int2float_rn(ih), __fmul_rn(x.y, __int2float_rn(il)));
    const float mins = __fmaf_rn(x.x, __int2float_rn(mh), __fmul_rn(x.y, __int2float_rn(ml)));
    return __fmaf_rn(d, dots, -__fmul_rn(dmin, mins));
}

// Adds a staged super-block's products to this lane's four outputs: rows `group` and group + 8
// of the warp's 16, times activation rows 2t and 2t + 1 of the tile.
static __device__ __forceinline__ void q4_k_superblock_256(const uint8_t *stage, int warp,
                                                           int group, int t, float acc[4]) {
    const int got0 = 2 * t, got1 = got0 + 1;
    const int2 *bsums0 = (const int2 *)(stage + MMT4_BSUMS + got0 * MMT4_BSUMS_STRIDE);
    const int2 *bsums1 = (const int2 *)(stage + MMT4_BSUMS + got1 * MMT4_BSUMS_STRIDE);
    // Per output (row a / b x token got0 / got1): the scaled sums of each part, and the
    // minimums times each part's sums.
    int ih[4] = {0, 0, 0, 0}, il[4] = {0, 0, 0, 0}, mh[4] = {0, 0, 0, 0},
        ml[4] = {0, 0, 0, 0};
    const float4 row_d = for_each_sub_block(
        stage, warp, group, t,
        [&](unsigned sub, const int ch[4], const int cl[4], int sc_a, int m_a, int sc_b,
            int m_b, float4) {
            const int2 s0 = make_int2(bsums0[2 * sub].x + bsums0[2 * sub + 1].x,
                                      bsums0[2 * sub].y + bsums0[2 * sub + 1].y);
            const int2 s1 = make_int2(bsums1[2 * sub].x + bsums1[2 * sub + 1].x,
                                      bsums1[2 * sub].y + bsums1[2 * sub + 1].y);
            const int sc[4] = {sc_a, sc_a, sc_b, sc_b}, m[4] = {m_a, m_a, m_b, m_b};
            const int2 s[4] = {s0, s1, s0, s1};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                ih[k] += sc[k] * ch[k];
                il[k] += sc[k] * cl[k];
                mh[k] += m[k] * s[k].x;
                ml[k] += m[k] * s[k].y;
            }
        });
    const float2 x0 = *(const float2 *)(stage + MMT4_SCALES + got0 * MMT4_STRIDE_SCALES);
    const float2 x1 = *(const float2 *)(stage + MMT4_SCALES + got1 * MMT4_STRIDE_SCALES);
    const float d[4] = {row_d.x, row_d.x, row_d.z, row_d.z};
    const float dmin[4] = {row_d.y, row_d.y, row_d.w, row_d.w};
    const float2 xs[4] = {x0, x1, x0, x1};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        acc[k] = __fadd_rn(acc[k],
                           superblock_value(d[k], dmin[k], xs[k], ih[k], il[k], mh[k], ml[k]));
    }
}

// Activations in groups of 256 (quantize_q8_256).
// Super-block values added one after another (mmv256 adds them so).
struct InOrderSums {
    float total[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    __device__ void finish() {}
};

struct Activations256 {
    const signed char *hi, *lo;
    const float2 *scales;
    const int2 *bsums;
    static constexpr int TOKENS = MMT_TOKENS;
    static constexpr int STAGE_BYTES = MMT4_STAGE_BYTES;
    using Sums = InOrderSums;
    static __device__ void stage_weights(uint8_t *to, const uint8_t *w, int row0, int rows,
                                         unsigned long long row_bytes, unsigned blk) {
        stage_q4_k_weights(to, w, row0, rows, row_bytes, blk);
    }
    __device__ void stage(uint8_t *to, int cols, int t0, int tokens, unsigned blk) const {
        stage_activations_256(to, hi, lo, scales, bsums, cols, t0, tokens, blk);
    }
    __device__ void multiply(const uint8_t *stage, int warp, int group, int t,
                             Sums &into) const {
        q4_k_superblock_256(stage, warp, group, t, into.total);
    }
};

extern "C" __global__ void __launch_bounds__(MMT_WARPS *WARP_SIZE)
    mmt4_q4_k(const uint8_t *w, int rows, unsigned long long row_bytes, int cols, int ksplit,
              const signed char *x_hi, const signed char *x_lo, const float2 *x_scales,
              const int2 *x_bsums, int tokens, float *out, float *partials,
              unsigned *counters) {
    __shared__ __align__(16) uint8_t stages[MMT_STAGES * Activations256::STAGE_BYTES];
    mmt_block({w, rows, nullptr, out}, {nullptr, 0, nullptr, nullptr},
              {nullptr, 0, nullptr, nullptr}, row_bytes, cols,
              Activations256{x_hi, x_lo, x_scales, x_bsums}, tokens, ksplit, partials, counters,
              stages);
}

// mmt5: mmt4's products with the work cut evenly between a fixed grid of blocks (stream-K):
// the (row block, super-block) steps of a tile of activation rows, row block after row block,
// are dealt out in equal contiguous ranges, one per block. A block writes a row block it
// covers whole; a row block shared between blocks gets a partial sum from each, and the last
// of them to finish adds them in the order of their ranges. Which blocks share which row block
// depends on the matrix and the grid alone, so a row's result never depends on the activation
// rows beside it.
struct StreamRanges {
    long long steps;
    int blocks, per_row_block;
    // Step `b * steps / blocks`, the first of block b.
    __device__ __forceinline__ long long first(int b) const { return (long long)b * steps / blocks; }
    // The block whose range holds step i.
    __device__ __forceinline__ int block_of(long long i) const {
        int b = (int)((i * blocks) / steps);
        while (b + 1 < blocks && first(b + 1) <= i) b++;
        while (first(b) > i) b--;
        return b;
    }
};

// Stages step i of a tile: row block i / per_row_block, super-block i % per_row_block.
static __device__ __forceinline__ void stage_step(uint8_t *stage, long long i, int per_row_block,
                                                  const uint8_t *w, int rows,
                                                  unsigned long long row_bytes, int cols,
                                                  const signed char *x_hi,
                                                  const signed char *x_lo,
                                                  const float2 *x_scales, const int2 *x_bsums,
                                                  int t0, int tokens) {
    const int row_block = (int)(i / per_row_block);
    const unsigned blk = (unsigned)(i % per_row_block);
    stage_q4_k_weights(stage, w, row_block * MMT_BLOCK_ROWS, rows, row_bytes, blk);
    stage_activations_256(stage, x_hi, x_lo, x_scales, x_bsums, cols, t0, tokens, blk);
}

extern "C" __global__ void __launch_bounds__(MMT_WARPS *WARP_SIZE)
    mmt5_q4_k(const uint8_t *w, int rows, unsigned long long row_bytes, int cols,
              const signed char *x_hi, const signed char *x_lo, const float2 *x_scales,
              const int2 *x_bsums, int tokens, float *out, float *partials,
              unsigned *counters) {
    __shared__ bool last;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int group = lane / 4, t = lane % 4;
    const int row_blocks = (rows + MMT_BLOCK_ROWS - 1) / MMT_BLOCK_ROWS, per_row_block = cols / 256;
    const StreamRanges ranges = {(long long)row_blocks * per_row_block, (int)gridDim.x,
                                 per_row_block};
    const int b = blockIdx.x, t0 = blockIdx.y * MMT_TOKENS;
    const long long begin = ranges.first(b), end = ranges.first(b + 1);
    const int n = (int)(end - begin);
    START_NEXT_KERNEL();
    WAIT_FOR_PREVIOUS_KERNEL();
    if (n > 0) {
        stage_step(smem, begin, per_row_block, w, rows, row_bytes, cols, x_hi, x_lo, x_scales,
                   x_bsums, t0, tokens);
    }
    commit_copies();
    const int got0 = 2 * t, got1 = got0 + 1;
    const int tok0 = t0 + got0, tok1 = t0 + got1;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    long long segment = begin;
#pragma unroll 1
    for (int k = 0; k < n; k++) {
        const long long i = begin + k;
        if (k + 1 < n) {
            stage_step(smem + ((k + 1) % MMT_STAGES) * MMT4_STAGE_BYTES, i + 1, per_row_block,
                       w, rows, row_bytes, cols, x_hi, x_lo, x_scales, x_bsums, t0, tokens);
        }
        commit_copies();
        wait_copies<1>();
        __syncthreads();
        q4_k_superblock_256(smem + (k % MMT_STAGES) * MMT4_STAGE_BYTES, warp, group, t, acc);
        // The stage just read is the next one staged into.
        __syncthreads();
        const bool row_block_ends = (i + 1) % per_row_block == 0 || k + 1 == n;
        if (!row_block_ends) {
            continue;
        }
        const int row_block = (int)(i / per_row_block);
        const int row_a = row_block * MMT_BLOCK_ROWS + MMT_ROWS * warp + group, row_b = row_a + 8;
        const bool has[4] = {row_a < rows && tok0 < tokens, row_a < rows && tok1 < tokens,
                             row_b < rows && tok0 < tokens, row_b < rows && tok1 < tokens};
        const size_t at[4] = {(size_t)tok0 * rows + row_a, (size_t)tok1 * rows + row_a,
                              (size_t)tok0 * rows + row_b, (size_t)tok1 * rows + row_b};
        const long long whole_begin = (long long)row_block * per_row_block;
        if (segment == whole_begin && i + 1 == whole_begin + per_row_block) {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                if (has[q]) out[at[q]] = acc[q];
                acc[q] = 0.0f;
            }
            segment = i + 1;
            continue;
        }
        // A partial: slot 0 of this block when it starts the block's range, slot 1 when it
        // ends it; each slot holds a tile's outputs of one row block.
        const int slot = segment == begin ? 0 : 1;
        const int local = MMT_ROWS * warp + group;
        float *mine = partials + ((size_t)(blockIdx.y * gridDim.x + b) * 2 + slot) * MMT_TOKENS *
                                     MMT_BLOCK_ROWS;
        const int idx[4] = {got0 * MMT_BLOCK_ROWS + local, got1 * MMT_BLOCK_ROWS + local,
                            got0 * MMT_BLOCK_ROWS + local + 8, got1 * MMT_BLOCK_ROWS + local + 8};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            mine[idx[q]] = acc[q];
            acc[q] = 0.0f;
        }
        segment = i + 1;
        __threadfence();
        __syncthreads();
        const int first_block = ranges.block_of(whole_begin);
        const int last_block = ranges.block_of(whole_begin + per_row_block - 1);
        if (threadIdx.x == 0) {
            last = atomicAdd(counters + blockIdx.y * row_blocks + row_block, 1) ==
                   (unsigned)(last_block - first_block);
        }
        __syncthreads();
        if (!last) {
            continue;
        }
        __threadfence();
        float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int other = first_block; other <= last_block; other++) {
            const int other_slot = ranges.first(other) >= whole_begin ? 0 : 1;
            const float *theirs = partials + ((size_t)(blockIdx.y * gridDim.x + other) * 2 +
                                              other_slot) * MMT_TOKENS * MMT_BLOCK_ROWS;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                sum[q] = __fadd_rn(sum[q], __ldcg(theirs + idx[q]));
            }
        }
#pragma unroll
        for (int q = 0; q < 4; q++) {
            if (has[q]) out[at[q]] = sum[q];
        }
        if (threadIdx.x == 0) {
            counters[blockIdx.y * row_blocks + row_block] = 0;
        }
    }
}

// mmv256: a matvec on mmt4's activations that adds the same super-block values
// (`superblock_value`) in the same order (mmt4's `ksplit` ranges in turn, each from zero, and
// the ranges' sums one after another when there are several), so that it gives mmt4's bits
// with a matvec's parallelism. A lane takes a 16-byte span of nibbles (half of two sub-blocks),
// eight lanes a super-block, a warp four super-blocks per turn; each super-block's integer sums
// meet in its first lane. Without ranges a warp takes `pair` rows one after another (two where
// a row is 4k + 2 super-blocks, so that no turn is half idle); with ranges a warp takes one
// range of one row, and the row's first warp adds the ranges in order.
#define MMV256_MAX_WARPS 32
extern "C" __global__ void mmv256_q4_k(const uint8_t *w, int rows, unsigned long long row_bytes,
                                       int cols, int ksplit, int pair,
                                       const signed char *x_hi, const signed char *x_lo,
                                       const float2 *x_scales, const int2 *x_bsums, int tokens,
                                       float *out) {
    __shared__ float partials[MMV256_MAX_WARPS];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int blocks = cols / 256, per_range = (blocks + ksplit - 1) / ksplit;
    // Without ranges: rows first_row.. (pair of them); with: range `range` of row first_row.
    const int global_warp = blockIdx.x * (blockDim.x / WARP_SIZE) + warp;
    const int first_row = ksplit == 1 ? global_warp * pair : global_warp / ksplit;
    const int range = ksplit == 1 ? 0 : global_warp % ksplit;
    const int row_count = ksplit == 1 ? min(pair, rows - first_row) : 1;
    const int first_item = range * per_range;
    const int items = ksplit == 1 ? row_count * blocks
                                  : max(0, min(blocks, first_item + per_range) - first_item);
    START_NEXT_KERNEL();
    WAIT_FOR_PREVIOUS_KERNEL();
    const int slot = lane / 8, span = lane % 8;
    // Span j of a super-block: chunk j / 2, bytes 16 (j % 2).. of it: the low nibbles are
    // elements of sub-block j / 2 * 2, the high nibbles of the next one.
    const int chunk = span / 2, l0 = 16 * (span % 2);
    for (int tok = 0; tok < tokens; tok++) {
        const signed char *xh = x_hi + (size_t)tok * cols, *xl = x_lo + (size_t)tok * cols;
        float partial = 0.0f;
#pragma unroll 1
        for (int first = 0; first < items; first += 4) {
            const int item = first + slot;
            int ih = 0, il = 0, mh = 0, ml = 0;
            float d = 0.0f, dmin = 0.0f;
            float2 xs = make_float2(0.0f, 0.0f);
            if (item < items && first_row < rows) {
                const int row = first_row + (ksplit == 1 ? item / blocks : 0);
                const int blk = ksplit == 1 ? item % blocks : first_item + item;
                const uint8_t *b = w + (size_t)row * row_bytes + (size_t)blk * 144;
                const uint4 head = *(const uint4 *)b;
                const unsigned q[3] = {head.y, head.z, head.w};
                int sc_lo, m_lo, sc_hi, m_hi;
                scale_min_k4_words(q, 2 * chunk, &sc_lo, &m_lo);
                scale_min_k4_words(q, 2 * chunk + 1, &sc_hi, &m_hi);
                int wq[4];
                load16(b + 16 + 32 * chunk + l0, wq);
                const size_t col = 256 * (size_t)blk + 64 * chunk + l0;
                int h0[4], h1[4], lo0[4], lo1[4];
                load16((const uint8_t *)(xh + col), h0);
                load16((const uint8_t *)(xh + col + 32), h1);
                load16((const uint8_t *)(xl + col), lo0);
                load16((const uint8_t *)(xl + col + 32), lo1);
                int run_lo_hi = 0, run_lo_lo = 0, run_hi_hi = 0, run_hi_lo = 0;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int low = wq[i] & 0x0F0F0F0F, high = (wq[i] >> 4) & 0x0F0F0F0F;
                    run_lo_hi = DP4A(low, h0[i], run_lo_hi);
                    run_lo_lo = DP4A(low, lo0[i], run_lo_lo);
                    run_hi_hi = DP4A(high, h1[i], run_hi_hi);
                    run_hi_lo = DP4A(high, lo1[i], run_hi_lo);
                }
                // The sums of these 16 activations: in 16-groups 4 * chunk + l0 / 16 and two
                // further.
                const int2 *bs = x_bsums + ((size_t)tok * blocks + blk) * 16 + 4 * chunk + l0 / 16;
                const int2 s_lo = bs[0], s_hi = bs[2];
                ih = sc_lo * run_lo_hi + sc_hi * run_hi_hi;
                il = sc_lo * run_lo_lo + sc_hi * run_hi_lo;
                mh = m_lo * s_lo.x + m_hi * s_hi.x;
                ml = m_lo * s_lo.y + m_hi * s_hi.y;
                d = half_of(head.x, false);
                dmin = half_of(head.x, true);
                xs = x_scales[(size_t)tok * blocks + blk];
            }
#pragma unroll
            for (int offset = 1; offset < 8; offset <<= 1) {
                ih += SHFL_XOR(ih, offset);
                il += SHFL_XOR(il, offset);
                mh += SHFL_XOR(mh, offset);
                ml += SHFL_XOR(ml, offset);
            }
            const float value = superblock_value(d, dmin, xs, ih, il, mh, ml);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int it = first + k;
                const float v = SHFL(value, 8 * k);
                if (it < items) {
                    partial = __fadd_rn(partial, v);
                    if (ksplit == 1 && (it + 1) % blocks == 0) {
                        if (lane == 0) {
                            out[(size_t)tok * rows + first_row + it / blocks] = partial;
                        }
                        partial = 0.0f;
                    }
                }
            }
        }
        if (ksplit > 1) {
            if (lane == 0) {
                partials[warp] = partial;
            }
            __syncthreads();
            if (range == 0 && lane == 0 && first_row < rows) {
                float total = 0.0f;
                for (int r = 0; r < ksplit; r++) {
                    total = __fadd_rn(total, partials[warp + r]);
                }
                out[(size_t)tok * rows + first_row] = total;
            }
            __syncthreads();
        }
    }
}
