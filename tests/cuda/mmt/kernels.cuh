// Candidate matmuls for every pass of a Q4_K matrix on the tensor cores, measured by bench.cu
// beside it and not used by the backend (the README's "Tensor cores for every pass" says what
// they showed and what adopting them takes):
//
// - mmt2: int8 m16n8k32 mma with the backend's two-part activations in groups of 32, blocks of
//   MMT2_WARPS warps of 16 weight rows streaming super-blocks through shared memory;
// - mmt4: the same with activations in groups of 256 (quantize_q8_256), integer sums per
//   super-block and one float expression per super-block (superblock_value);
// - mmt5: mmt4's products, the work dealt out in equal ranges to a fixed grid (stream-K);
// - mmv256: a one-row matvec on mmt4's activations that gives mmt4's bits.
//
// Each computes a row the same way whatever the other activation rows of the pass, so one of
// them could serve decode, verify steps, batches and prefill alike. Where a lane's columns
// sit inside an mma is free as long as weights and activations agree, so each lane feeds 8
// consecutive columns: 8 bytes of a row of activations, and the matching nibbles of its two
// weight rows, which lie in 8 consecutive bytes of a Q4_K block.
#pragma once

#include "../../../kernels/cuda/q8.cuh"
#include "../../../kernels/cuda/qspan.cuh"

#define MMT_ROWS 16
#define MMT_TOKENS 8

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

// mmt2: blocks of MMT2_WARPS warps over 16 weight rows each and one tile of 8 activation rows, which stream
// the super-blocks of their K range through shared memory (cp.async, MMT2_STAGES in flight):
// each weight byte is read from global memory once, in 16-byte pieces, and each warp loads its
// fragments from shared memory, where rows are padded so that a warp's loads fall in distinct
// banks. Where a matrix has fewer row blocks than the GPU has room for, the super-blocks are
// cut into `ksplit` ranges, one block each; the last block of a row block to finish adds the
// ranges' sums in order (a counter per row block and tile, left at zero).
#ifndef MMT2_WARPS
#define MMT2_WARPS 4
#endif
#define MMT2_ROWS (MMT2_WARPS * MMT_ROWS)
#ifndef MMT2_STAGES
#define MMT2_STAGES 2
#endif
#define MMT2_W_STRIDE 160
#define MMT2_X_STRIDE 288
#define MMT2_S_STRIDE 144
#define MMT2_X_HI (MMT2_ROWS * MMT2_W_STRIDE)
#define MMT2_X_LO (MMT2_X_HI + MMT_TOKENS * MMT2_X_STRIDE)
#define MMT2_SCALES (MMT2_X_LO + MMT_TOKENS * MMT2_X_STRIDE)
#define MMT2_STAGE_BYTES (MMT2_SCALES + MMT_TOKENS * MMT2_S_STRIDE)
#define MMT2_SMEM (MMT2_STAGES * MMT2_STAGE_BYTES)

// The stages of the streaming kernels (dynamic shared memory, sized at launch).
extern __shared__ __align__(16) uint8_t smem[];

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

// Copies super-block blk of the block's 128 rows into a stage.
static __device__ __forceinline__ void stage_q4_k_weights(uint8_t *stage, const uint8_t *w,
                                                          int row0, int rows,
                                                          unsigned long long row_bytes,
                                                          unsigned blk) {
    for (int p = threadIdx.x; p < MMT2_ROWS * 9; p += blockDim.x) {
        const int r = p / 9, piece = p % 9;
        const int row = min(row0 + r, rows - 1);
        copy16_async(stage + r * MMT2_W_STRIDE + 16 * piece,
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
            copy16_async(stage + (part ? MMT2_X_LO : MMT2_X_HI) + tok * MMT2_X_STRIDE + 16 * piece,
                         (part ? x_lo : x_hi) + (size_t)(t0 + tok) * cols + 256 * blk +
                             16 * piece);
        }
    }
    for (int p = threadIdx.x; p < MMT_TOKENS * 16; p += blockDim.x) {
        const int tok = p / 16, g = (p / 2) % 8, sums = p % 2;
        if (t0 + tok < tokens) {
            const size_t group = (size_t)(t0 + tok) * groups + 8 * blk + g;
            copy8_async(stage + MMT2_SCALES + tok * MMT2_S_STRIDE + 16 * g + 8 * sums,
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
    const uint8_t *x = stage + MMT2_X_HI + group * MMT2_X_STRIDE + 32 * sub + 8 * t;
    const int2 xh = *(const int2 *)x;
    const int2 xl = *(const int2 *)(x + MMT2_X_LO - MMT2_X_HI);
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
    const uint8_t *ra = stage + (MMT_ROWS * warp + group) * MMT2_W_STRIDE;
    const uint8_t *rb = ra + 8 * MMT2_W_STRIDE;
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
// of the warp's 16, times activation rows 2t and 2t + 1 of the tile), for activations in
// groups of 32: each sub-block's integer sums are scaled in float.
static __device__ __forceinline__ void q4_k_superblock_32(const uint8_t *stage, int warp,
                                                          int group, int t, float acc[4]) {
    const int got0 = 2 * t, got1 = got0 + 1;
    for_each_sub_block(stage, warp, group, t,
                       [&](unsigned sub, const int ch[4], const int cl[4], int sc_a, int m_a,
                           int sc_b, int m_b, float4 d) {
        const float d_a = d.x, dmin_a = d.y, d_b = d.z, dmin_b = d.w;
        const float4 s0 =
            *(const float4 *)(stage + MMT2_SCALES + got0 * MMT2_S_STRIDE + 16 * sub);
        const float4 s1 =
            *(const float4 *)(stage + MMT2_SCALES + got1 * MMT2_S_STRIDE + 16 * sub);
        const float sum0 = s0.z + s0.w, sum1 = s1.z + s1.w;
        const float v00 = s0.x * exact_float(ch[0]) + s0.y * exact_float(cl[0]);
        const float v01 = s1.x * exact_float(ch[1]) + s1.y * exact_float(cl[1]);
        const float v10 = s0.x * exact_float(ch[2]) + s0.y * exact_float(cl[2]);
        const float v11 = s1.x * exact_float(ch[3]) + s1.y * exact_float(cl[3]);
        const float ds_a = d_a * (float)sc_a, dm_a = dmin_a * (float)m_a;
        const float ds_b = d_b * (float)sc_b, dm_b = dmin_b * (float)m_b;
        acc[0] += ds_a * v00 - dm_a * sum0;
        acc[1] += ds_a * v01 - dm_a * sum1;
        acc[2] += ds_b * v10 - dm_b * sum0;
        acc[3] += ds_b * v11 - dm_b * sum1;
    });
}

// mmt4: mmt2 with activations quantized per 256 values (one (d_hi, d_lo) per super-block, and
// the integer sum of each part per sub-block of 32), as the CPU quantizes them for the
// K-quants: a sub-block's integer sums are scaled by its integer scale and added in integers,
// and the float work is done once per super-block instead of once per sub-block.
#define MMT4_STRIDE_SCALES 16
#define MMT4_BSUMS_STRIDE 144
#define MMT4_SCALES (MMT2_X_LO + MMT_TOKENS * MMT2_X_STRIDE)
#define MMT4_BSUMS (MMT4_SCALES + MMT_TOKENS * MMT4_STRIDE_SCALES)
#define MMT4_STAGE_BYTES (MMT4_BSUMS + MMT_TOKENS * MMT4_BSUMS_STRIDE)
#define MMT4_SMEM (MMT2_STAGES * MMT4_STAGE_BYTES)

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
            copy16_async(stage + (part ? MMT2_X_LO : MMT2_X_HI) + tok * MMT2_X_STRIDE + 16 * piece,
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

// Activations in groups of 32 (the backend's): how a stage holds them and how a staged
// super-block is multiplied.
struct Activations32 {
    const signed char *hi, *lo;
    const float2 *scales;
    const float *sums;
    static constexpr int STAGE_BYTES = MMT2_STAGE_BYTES;
    __device__ void stage(uint8_t *to, int cols, int t0, int tokens, unsigned blk) const {
        stage_activations(to, hi, lo, scales, sums, cols, t0, tokens, blk);
    }
    __device__ void multiply(const uint8_t *stage, int warp, int group, int t,
                             float acc[4]) const {
        q4_k_superblock_32(stage, warp, group, t, acc);
    }
};

// Activations in groups of 256 (quantize_q8_256).
struct Activations256 {
    const signed char *hi, *lo;
    const float2 *scales;
    const int2 *bsums;
    static constexpr int STAGE_BYTES = MMT4_STAGE_BYTES;
    __device__ void stage(uint8_t *to, int cols, int t0, int tokens, unsigned blk) const {
        stage_activations_256(to, hi, lo, scales, bsums, cols, t0, tokens, blk);
    }
    __device__ void multiply(const uint8_t *stage, int warp, int group, int t,
                             float acc[4]) const {
        q4_k_superblock_256(stage, warp, group, t, acc);
    }
};

// mmt2 and mmt4: block (row block, range) of grid.x and tile grid.y streams its range's
// super-blocks through MMT2_STAGES stages, then writes its outputs, or with several ranges its
// partial sums, of which the last block of the row block to finish adds all in range order.
template <typename Activations>
static __device__ __forceinline__ void mmt_streamed(const uint8_t *w, int rows,
                                                    unsigned long long row_bytes, int cols,
                                                    int ksplit, const Activations &x,
                                                    int tokens, float *out, float *partials,
                                                    unsigned *counters) {
    __shared__ bool last;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int group = lane / 4, t = lane % 4;
    const int row_blocks = (rows + MMT2_ROWS - 1) / MMT2_ROWS;
    const int row_block = blockIdx.x % row_blocks, range = blockIdx.x / row_blocks;
    const int row0 = row_block * MMT2_ROWS, t0 = blockIdx.y * MMT_TOKENS;
    const unsigned blocks = cols / 256, per_range = (blocks + ksplit - 1) / ksplit;
    const unsigned first = range * per_range, last_blk = min(blocks, first + per_range);
    const int n = last_blk > first ? (int)(last_blk - first) : 0;
    START_NEXT_KERNEL();
#pragma unroll
    for (int i = 0; i < MMT2_STAGES - 1; i++) {
        if (i < n) {
            stage_q4_k_weights(smem + i * Activations::STAGE_BYTES, w, row0, rows, row_bytes,
                               first + i);
        }
    }
    WAIT_FOR_PREVIOUS_KERNEL();
#pragma unroll
    for (int i = 0; i < MMT2_STAGES - 1; i++) {
        if (i < n) {
            x.stage(smem + i * Activations::STAGE_BYTES, cols, t0, tokens, first + i);
        }
        commit_copies();
    }
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
    for (int i = 0; i < n; i++) {
        wait_copies<MMT2_STAGES - 2>();
        __syncthreads();
        const int next = i + MMT2_STAGES - 1;
        if (next < n) {
            uint8_t *stage = smem + (next % MMT2_STAGES) * Activations::STAGE_BYTES;
            stage_q4_k_weights(stage, w, row0, rows, row_bytes, first + next);
            x.stage(stage, cols, t0, tokens, first + next);
        }
        commit_copies();
        x.multiply(smem + (i % MMT2_STAGES) * Activations::STAGE_BYTES, warp, group, t, acc);
    }
    const int got0 = 2 * t, got1 = got0 + 1;
    const int row_a = row0 + MMT_ROWS * warp + group, row_b = row_a + 8;
    const int tok0 = t0 + got0, tok1 = t0 + got1;
    const bool has[4] = {row_a < rows && tok0 < tokens, row_a < rows && tok1 < tokens,
                         row_b < rows && tok0 < tokens, row_b < rows && tok1 < tokens};
    const size_t at[4] = {(size_t)tok0 * rows + row_a, (size_t)tok1 * rows + row_a,
                          (size_t)tok0 * rows + row_b, (size_t)tok1 * rows + row_b};
    if (ksplit == 1) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (has[i]) out[at[i]] = acc[i];
        }
        return;
    }
    float *mine = partials + (size_t)(blockIdx.y * ksplit + range) * MMT_TOKENS * rows;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (has[i]) mine[at[i] - (size_t)t0 * rows] = acc[i];
    }
    __threadfence();
    __syncthreads();
    unsigned *counter = counters + blockIdx.y * row_blocks + row_block;
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1) == (unsigned)ksplit - 1;
    }
    __syncthreads();
    if (!last) {
        return;
    }
    __threadfence();
    const float *tile = partials + (size_t)blockIdx.y * ksplit * MMT_TOKENS * rows;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (has[i]) {
            float sum = 0.0f;
            for (int r = 0; r < ksplit; r++) {
                sum += __ldcg(tile + (size_t)r * MMT_TOKENS * rows + at[i] - (size_t)t0 * rows);
            }
            out[at[i]] = sum;
        }
    }
    if (threadIdx.x == 0) {
        *counter = 0;
    }
}


extern "C" __global__ void __launch_bounds__(MMT2_WARPS *WARP_SIZE)
    mmt2_q4_k(const uint8_t *w, int rows, unsigned long long row_bytes, int cols, int ksplit,
              const signed char *x_hi, const signed char *x_lo, const float2 *x_scales,
              const float *x_sums, int tokens, float *out, float *partials,
              unsigned *counters) {
    mmt_streamed(w, rows, row_bytes, cols, ksplit, Activations32{x_hi, x_lo, x_scales, x_sums},
                 tokens, out, partials, counters);
}

extern "C" __global__ void __launch_bounds__(MMT2_WARPS *WARP_SIZE)
    mmt4_q4_k(const uint8_t *w, int rows, unsigned long long row_bytes, int cols, int ksplit,
              const signed char *x_hi, const signed char *x_lo, const float2 *x_scales,
              const int2 *x_bsums, int tokens, float *out, float *partials,
              unsigned *counters) {
    mmt_streamed(w, rows, row_bytes, cols, ksplit,
                 Activations256{x_hi, x_lo, x_scales, x_bsums}, tokens, out, partials, counters);
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
    stage_q4_k_weights(stage, w, row_block * MMT2_ROWS, rows, row_bytes, blk);
    stage_activations_256(stage, x_hi, x_lo, x_scales, x_bsums, cols, t0, tokens, blk);
}

extern "C" __global__ void __launch_bounds__(MMT2_WARPS *WARP_SIZE)
    mmt5_q4_k(const uint8_t *w, int rows, unsigned long long row_bytes, int cols,
              const signed char *x_hi, const signed char *x_lo, const float2 *x_scales,
              const int2 *x_bsums, int tokens, float *out, float *partials,
              unsigned *counters) {
    __shared__ bool last;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int group = lane / 4, t = lane % 4;
    const int row_blocks = (rows + MMT2_ROWS - 1) / MMT2_ROWS, per_row_block = cols / 256;
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
            stage_step(smem + ((k + 1) % MMT2_STAGES) * MMT4_STAGE_BYTES, i + 1, per_row_block,
                       w, rows, row_bytes, cols, x_hi, x_lo, x_scales, x_bsums, t0, tokens);
        }
        commit_copies();
        wait_copies<1>();
        __syncthreads();
        q4_k_superblock_256(smem + (k % MMT2_STAGES) * MMT4_STAGE_BYTES, warp, group, t, acc);
        // The stage just read is the next one staged into.
        __syncthreads();
        const bool row_block_ends = (i + 1) % per_row_block == 0 || k + 1 == n;
        if (!row_block_ends) {
            continue;
        }
        const int row_block = (int)(i / per_row_block);
        const int row_a = row_block * MMT2_ROWS + MMT_ROWS * warp + group, row_b = row_a + 8;
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
                                     MMT2_ROWS;
        const int idx[4] = {got0 * MMT2_ROWS + local, got1 * MMT2_ROWS + local,
                            got0 * MMT2_ROWS + local + 8, got1 * MMT2_ROWS + local + 8};
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
                                              other_slot) * MMT_TOKENS * MMT2_ROWS;
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
