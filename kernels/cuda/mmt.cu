// Q4_K matrices times the backend's two-part activations (q8.cuh) on the tensor cores, for
// passes of any number of activation rows: decode, verify steps, batches and prefill alike.
// The host profile's `streamed_matmul` chooses it over the matvec and mmq.cu.
//
// mmq.cu reproduces the matvec's order of float additions, which ties it to the matvec's
// per-span work and makes a pass of n tokens cost about n / 2 decode steps below six rows.
// This kernel keeps its own order instead, the same for every row whatever the other
// activation rows of the pass, so that one kernel serves every pass length and a row's result
// is the same bits in all of them (speculative greedy equals plain greedy, and a sequence's
// logits do not depend on its batch), though not the matvec's bits.
//
// A block of MMT_WARPS warps takes MMT_BLOCK_ROWS weight rows, 16 per warp, and a tile of
// MMT_TOKENS activation rows. It streams the super-blocks of its K range through shared memory
// (cp.async, MMT_STAGES in flight): each weight byte is read from global memory once per tile,
// in 16-byte pieces, and each warp loads its mma fragments from shared memory, where rows are
// padded so that a warp's loads fall in distinct banks. A sub-block of 32 columns is one
// mma.sync m16n8k32 s8 per activation part; each lane feeds 8 consecutive columns (8 bytes of
// activations, the matching nibbles of its two weight rows, 8 consecutive bytes of a Q4_K
// block): where a column sits inside an mma is free as long as both sides agree. Integer sums
// are exact; each sub-block's are scaled in float and added to the lane's outputs in turn.
//
// Where a launch has fewer row blocks than the GPU has SMs, the super-blocks are cut into
// `ksplit` ranges, one block each, chosen by the host from the matrices' shape alone (never
// from the number of activation rows, which would change a row's bits); the last block of a
// row block and tile to finish adds the ranges' sums in order (a counter per row block and
// tile, left at zero), then the bias.
//
// The mma instructions exist from sm_80; HIP builds none of this (crates/backend/build.rs).

#include "qspan.cuh"

#if !defined(__HIP__)

// Weight rows per warp (the m16 of one mma), activation rows per tile (its n8).
#define MMT_ROWS 16
#define MMT_TOKENS 8
#ifndef MMT_WARPS
#define MMT_WARPS 4
#endif
#define MMT_BLOCK_ROWS (MMT_WARPS * MMT_ROWS)
#ifndef MMT_STAGES
#define MMT_STAGES 2
#endif
// Bytes per staged weight row (a 144-byte Q4_K block, padded), per staged activation row of
// one part (256 bytes, padded), and per staged row of scales and sums (8 groups of 16 bytes).
#define MMT_W_STRIDE 160
#define MMT_X_STRIDE 288
#define MMT_S_STRIDE 144
#define MMT_X_HI (MMT_BLOCK_ROWS * MMT_W_STRIDE)
#define MMT_X_LO (MMT_X_HI + MMT_TOKENS * MMT_X_STRIDE)
#define MMT_SCALES (MMT_X_LO + MMT_TOKENS * MMT_X_STRIDE)
#define MMT_STAGE_BYTES (MMT_SCALES + MMT_TOKENS * MMT_S_STRIDE)

// c = a . b over 32 columns: a 16 x 32 (row), b 32 x 8 (column), in the fragment layout of
// PTX's m16n8k32 .s8 mma (lane = 4 * group + t: a0, a2 row `group`, a1, a3 row group + 8, each
// four columns 4t.. and 16 + 4t..; b0, b1 the same columns of column `group`).
static __device__ __forceinline__ void mma_k32(int c[4], const int a[4], int b0, int b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

// The f16 in the low (high = false) or high half of w.
static __device__ __forceinline__ float half_of(unsigned w, bool high) {
    return __half2float(__ushort_as_half((unsigned short)(high ? w >> 16 : w & 0xFFFF)));
}

static __device__ __forceinline__ void copy16_async(uint8_t *to, const void *from) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                     (unsigned)__cvta_generic_to_shared(to)),
                 "l"(from));
}

static __device__ __forceinline__ void copy8_async(uint8_t *to, const void *from) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(
                     (unsigned)__cvta_generic_to_shared(to)),
                 "l"(from));
}

static __device__ __forceinline__ void commit_copies() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// Waits until at most `pending` groups of this thread's copies are in flight.
template <int pending> static __device__ __forceinline__ void wait_copies() {
    asm volatile("cp.async.wait_group %0;" ::"n"(pending) : "memory");
}

// Copies super-block blk of the block's rows row0.. (the last row repeated past `rows`) into a
// stage.
static __device__ __forceinline__ void stage_q4_k_weights(uint8_t *stage, const uint8_t *w,
                                                          int row0, int rows,
                                                          unsigned long long row_bytes,
                                                          unsigned blk) {
    for (int p = threadIdx.x; p < MMT_BLOCK_ROWS * 9; p += blockDim.x) {
        const int r = p / 9, piece = p % 9;
        const int row = min(row0 + r, rows - 1);
        copy16_async(stage + r * MMT_W_STRIDE + 16 * piece,
                     w + (size_t)row * row_bytes + (size_t)blk * 144 + 16 * piece);
    }
}

// Copies the activations of super-block blk for rows t0.. into a stage: both parts, and per
// group of 32 (d_hi, d_lo, sum of the first 16, sum of the second 16).
static __device__ __forceinline__ void stage_activations(uint8_t *stage, const signed char *x_hi,
                                                         const signed char *x_lo,
                                                         const float2 *x_scales,
                                                         const float *x_sums, int cols,
                                                         int t0, int tokens, unsigned blk) {
    const unsigned groups = cols / SPAN;
    for (int p = threadIdx.x; p < MMT_TOKENS * 32; p += blockDim.x) {
        const int tok = p / 32, part = (p / 16) % 2, piece = p % 16;
        if (t0 + tok < tokens) {
            copy16_async(stage + (part ? MMT_X_LO : MMT_X_HI) + tok * MMT_X_STRIDE + 16 * piece,
                         (part ? x_lo : x_hi) + (size_t)(t0 + tok) * cols + 256 * blk +
                             16 * piece);
        }
    }
    for (int p = threadIdx.x; p < MMT_TOKENS * 16; p += blockDim.x) {
        const int tok = p / 16, g = (p / 2) % 8, sums = p % 2;
        if (t0 + tok < tokens) {
            const size_t group = (size_t)(t0 + tok) * groups + 8 * blk + g;
            copy8_async(stage + MMT_SCALES + tok * MMT_S_STRIDE + 16 * g + 8 * sums,
                        sums ? (const void *)(x_sums + 2 * group) : (const void *)(x_scales + group));
        }
    }
}

// The integer products of sub-block `sub` of a staged super-block (pa, pb: this lane's bytes
// of its chunk of nibbles in rows `group` and group + 8) with each part of activation row
// `group`, in the mma's layout: ch, cl hold rows group and group + 8 times activation rows 2t
// and 2t + 1.
static __device__ __forceinline__ void sub_block_products(const uint8_t *stage, uint2 pa,
                                                          uint2 pb, unsigned sub, int group,
                                                          int t, int ch[4], int cl[4]) {
    const unsigned shift = 4 * (sub % 2);
    const int a[4] = {(int)((pa.x >> shift) & 0x0F0F0F0F), (int)((pb.x >> shift) & 0x0F0F0F0F),
                      (int)((pa.y >> shift) & 0x0F0F0F0F), (int)((pb.y >> shift) & 0x0F0F0F0F)};
    const uint8_t *x = stage + MMT_X_HI + group * MMT_X_STRIDE + 32 * sub + 8 * t;
    const int2 xh = *(const int2 *)x;
    const int2 xl = *(const int2 *)(x + MMT_X_LO - MMT_X_HI);
    mma_k32(ch, a, xh.x, xh.y);
    mma_k32(cl, a, xl.x, xl.y);
}

// The rows of this lane in a staged super-block, rows `group` and group + 8 of the warp's 16:
// for each sub-block, `use(sub, ch, cl, sc_a, m_a, sc_b, m_b, d)` with its integer products
// (sub_block_products), the two rows' 6-bit scales and minimums, and their (d, dmin, d, dmin),
// which it also returns.
template <typename Use>
static __device__ __forceinline__ float4 for_each_sub_block(const uint8_t *stage, int warp,
                                                           int group, int t, Use use) {
    const uint8_t *ra = stage + (MMT_ROWS * warp + group) * MMT_W_STRIDE;
    const uint8_t *rb = ra + 8 * MMT_W_STRIDE;
    const uint4 head_a = *(const uint4 *)ra, head_b = *(const uint4 *)rb;
    const unsigned qa[3] = {head_a.y, head_a.z, head_a.w};
    const unsigned qb[3] = {head_b.y, head_b.z, head_b.w};
    const float4 d = make_float4(half_of(head_a.x, false), half_of(head_a.x, true),
                                 half_of(head_b.x, false), half_of(head_b.x, true));
#pragma unroll
    for (unsigned chunk = 0; chunk < 4; chunk++) {
        const uint2 pa = *(const uint2 *)(ra + 16 + 32 * chunk + 8 * t);
        const uint2 pb = *(const uint2 *)(rb + 16 + 32 * chunk + 8 * t);
#pragma unroll
        for (unsigned high = 0; high < 2; high++) {
            const unsigned sub = 2 * chunk + high;
            int ch[4], cl[4];
            sub_block_products(stage, pa, pb, sub, group, t, ch, cl);
            int sc_a, m_a, sc_b, m_b;
            scale_min_k4_words(qa, sub, &sc_a, &m_a);
            scale_min_k4_words(qb, sub, &sc_b, &m_b);
            use(sub, ch, cl, sc_a, m_a, sc_b, m_b, d);
        }
    }
    return d;
}

// Adds a staged super-block's products to this lane's four outputs (rows `group` and group + 8
// of the warp's 16, times activation rows 2t and 2t + 1 of the tile): each sub-block's integer
// sums are scaled in float, with rounding spelled out so that no contraction choice of the
// compiler can differ between outputs.
static __device__ __forceinline__ void q4_k_superblock(const uint8_t *stage, int warp,
                                                       int group, int t, float acc[4]) {
    const int got0 = 2 * t, got1 = got0 + 1;
    for_each_sub_block(stage, warp, group, t,
                       [&](unsigned sub, const int ch[4], const int cl[4], int sc_a, int m_a,
                           int sc_b, int m_b, float4 d) {
        const float4 s0 = *(const float4 *)(stage + MMT_SCALES + got0 * MMT_S_STRIDE + 16 * sub);
        const float4 s1 = *(const float4 *)(stage + MMT_SCALES + got1 * MMT_S_STRIDE + 16 * sub);
        const float sum[4] = {__fadd_rn(s0.z, s0.w), __fadd_rn(s1.z, s1.w),
                              __fadd_rn(s0.z, s0.w), __fadd_rn(s1.z, s1.w)};
        const float2 x[4] = {make_float2(s0.x, s0.y), make_float2(s1.x, s1.y),
                             make_float2(s0.x, s0.y), make_float2(s1.x, s1.y)};
        const float ds[4] = {__fmul_rn(d.x, (float)sc_a), __fmul_rn(d.x, (float)sc_a),
                             __fmul_rn(d.z, (float)sc_b), __fmul_rn(d.z, (float)sc_b)};
        const float dm[4] = {__fmul_rn(d.y, (float)m_a), __fmul_rn(d.y, (float)m_a),
                             __fmul_rn(d.w, (float)m_b), __fmul_rn(d.w, (float)m_b)};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float v =
                __fmaf_rn(x[k].x, exact_float(ch[k]), __fmul_rn(x[k].y, exact_float(cl[k])));
            acc[k] = __fadd_rn(acc[k], __fmaf_rn(ds[k], v, -__fmul_rn(dm[k], sum[k])));
        }
    });
}

// The backend's activations (groups of 32): how a stage holds them and how a staged super-block
// is multiplied. The block below takes any such policy (tests/cuda/mmt measures others).
struct Activations32 {
    const signed char *hi, *lo;
    const float2 *scales;
    const float *sums;
    static constexpr int STAGE_BYTES = MMT_STAGE_BYTES;
    __device__ void stage(uint8_t *to, int cols, int t0, int tokens, unsigned blk) const {
        stage_activations(to, hi, lo, scales, sums, cols, t0, tokens, blk);
    }
    __device__ void multiply(const uint8_t *stage, int warp, int group, int t,
                             float acc[4]) const {
        q4_k_superblock(stage, warp, group, t, acc);
    }
};

// The row blocks of a part of `rows` rows.
static __device__ __forceinline__ int row_blocks_of(int rows) {
    return (rows + MMT_BLOCK_ROWS - 1) / MMT_BLOCK_ROWS;
}

// Block (row block, range, tile) of grid.x, row blocks first: streams its range's super-blocks,
// then writes its outputs, or with several ranges its partial sums, of which the last block
// of the row block and tile to finish adds all in range order. `part` is the launch's first
// matrix; row blocks continue into `second` and `third` (chosen by comparisons, not by
// indexing an array, which would put the parts in memory).
template <typename Activations>
static __device__ __forceinline__ void mmt_q4_k_block(MatvecPart part, const MatvecPart second,
                                                      const MatvecPart third,
                                                      unsigned long long row_bytes, int cols,
                                                      const Activations &x, int tokens,
                                                      int ksplit, float *partials,
                                                      unsigned *counters) {
    __shared__ __align__(16) uint8_t stages[MMT_STAGES * Activations::STAGE_BYTES];
    __shared__ bool last;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int group = lane / 4, t = lane % 4;
    const int blocks_first = row_blocks_of(part.rows), blocks_second = row_blocks_of(second.rows);
    const int row_blocks = blocks_first + blocks_second + row_blocks_of(third.rows);
    const int row_block = blockIdx.x % row_blocks;
    const int range = blockIdx.x / row_blocks % ksplit, tile = blockIdx.x / row_blocks / ksplit;
    int local = row_block;
    if (local >= blocks_first) {
        local -= blocks_first;
        part = second;
        if (local >= blocks_second) {
            local -= blocks_second;
            part = third;
        }
    }
    const int rows = part.rows, row0 = local * MMT_BLOCK_ROWS, t0 = tile * MMT_TOKENS;
    const unsigned blocks = cols / 256, per_range = (blocks + ksplit - 1) / ksplit;
    const unsigned first = range * per_range, last_blk = min(blocks, first + per_range);
    const int n = last_blk > first ? (int)(last_blk - first) : 0;
    START_NEXT_KERNEL();
#pragma unroll
    for (int i = 0; i < MMT_STAGES - 1; i++) {
        if (i < n) {
            stage_q4_k_weights(stages + i * Activations::STAGE_BYTES, part.w, row0, rows,
                               row_bytes, first + i);
        }
    }
    WAIT_FOR_PREVIOUS_KERNEL();
#pragma unroll
    for (int i = 0; i < MMT_STAGES - 1; i++) {
        if (i < n) {
            x.stage(stages + i * Activations::STAGE_BYTES, cols, t0, tokens, first + i);
        }
        commit_copies();
    }
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
    for (int i = 0; i < n; i++) {
        wait_copies<MMT_STAGES - 2>();
        __syncthreads();
        const int next = i + MMT_STAGES - 1;
        if (next < n) {
            uint8_t *stage = stages + (next % MMT_STAGES) * Activations::STAGE_BYTES;
            stage_q4_k_weights(stage, part.w, row0, rows, row_bytes, first + next);
            x.stage(stage, cols, t0, tokens, first + next);
        }
        commit_copies();
        x.multiply(stages + (i % MMT_STAGES) * Activations::STAGE_BYTES, warp, group, t, acc);
    }
    const int got0 = 2 * t, got1 = got0 + 1;
    const int in_block_a = MMT_ROWS * warp + group, in_block_b = in_block_a + 8;
    const int row_a = row0 + in_block_a, row_b = row0 + in_block_b;
    const int tok0 = t0 + got0, tok1 = t0 + got1;
    const bool has[4] = {row_a < rows && tok0 < tokens, row_a < rows && tok1 < tokens,
                         row_b < rows && tok0 < tokens, row_b < rows && tok1 < tokens};
    const int row_of[4] = {row_a, row_a, row_b, row_b};
    const size_t at[4] = {(size_t)tok0 * rows + row_a, (size_t)tok1 * rows + row_a,
                          (size_t)tok0 * rows + row_b, (size_t)tok1 * rows + row_b};
    if (ksplit > 1) {
        // Partial sums: [tile][range][row block][row in block][activation row in tile].
        const int slot[4] = {in_block_a * MMT_TOKENS + got0, in_block_a * MMT_TOKENS + got1,
                             in_block_b * MMT_TOKENS + got0, in_block_b * MMT_TOKENS + got1};
        const size_t range_len = (size_t)row_blocks * MMT_BLOCK_ROWS * MMT_TOKENS;
        float *tile_partials = partials + (size_t)tile * ksplit * range_len +
                               (size_t)row_block * MMT_BLOCK_ROWS * MMT_TOKENS;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            tile_partials[range * range_len + slot[k]] = acc[k];
        }
        __threadfence();
        __syncthreads();
        unsigned *counter = counters + (size_t)tile * row_blocks + row_block;
        if (threadIdx.x == 0) {
            last = atomicAdd(counter, 1) == (unsigned)ksplit - 1;
        }
        __syncthreads();
        if (!last) {
            return;
        }
        __threadfence();
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float sum = 0.0f;
            for (int r = 0; r < ksplit; r++) {
                sum = __fadd_rn(sum, __ldcg(tile_partials + r * range_len + slot[k]));
            }
            acc[k] = sum;
        }
        if (threadIdx.x == 0) {
            *counter = 0;
        }
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (has[k]) {
            part.out[at[k]] = part.bias ? __fadd_rn(acc[k], part.bias[row_of[k]]) : acc[k];
        }
    }
}

extern "C" __global__ void __launch_bounds__(MMT_WARPS *WARP_SIZE)
    mmt_q4_k(const uint8_t *w0, int rows0, const float *bias0, float *out0, const uint8_t *w1,
             int rows1, const float *bias1, float *out1, const uint8_t *w2, int rows2,
             const float *bias2, float *out2, unsigned long long row_bytes, int cols,
             const signed char *x_hi, const signed char *x_lo, const float2 *x_scales,
             const float *x_sums, int tokens, int ksplit, float *partials,
             unsigned *counters) {
    mmt_q4_k_block({w0, rows0, bias0, out0}, {w1, rows1, bias1, out1}, {w2, rows2, bias2, out2},
                   row_bytes, cols, Activations32{x_hi, x_lo, x_scales, x_sums}, tokens, ksplit,
                   partials, counters);
}

#endif
