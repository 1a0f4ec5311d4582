// Q4_K and Q6_K matrices times the backend's quantized activations (q8.cuh) on the tensor cores,
// for passes of any number of activation rows: decode, verify steps, batches and prefill alike.
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
// MMT_TOKENS activation rows, or in large launches of more rows a wide tile of MMT_WIDE_TOKENS
// (each warp's mma then in two slices of eight, its weights decoded once). It streams the
// super-blocks of its K range through shared memory (cp.async, MMT_STAGES in flight): each
// weight byte is read from global memory once per tile, in 16-byte pieces, and each warp loads
// its mma fragments from shared memory, where rows are padded so that a warp's loads fall in
// distinct banks. A Q4_K sub-block of 32 columns is one mma.sync m16n8k32 s8 per activation
// part; each lane feeds 8 consecutive columns (8 bytes of
// activations, the matching nibbles of its two weight rows, 8 consecutive bytes of a Q4_K
// block): where a column sits inside an mma is free as long as both sides agree. A Q6_K
// sub-block has a scale per 16 columns, so it is an m16n8k16 per half and part, its quants
// taken as q - 32. Integer sums are exact; each sub-block's are scaled in float
// (<format>_sub_block_value), and a row's values are added in the order of a warp reduction:
// each turn of four super-blocks (32 sub-blocks) as a pairwise tree, the turns in order
// (TurnSums). So a one-row kernel whose lanes take a sub-block each and whose warp adds them
// with a butterfly (mmt_row_<format>) gives the same bits, and decode and short passes take it:
// on a single row, the tiles' blocks of four warps, each waiting on its staged super-block,
// hide less latency than many independent warps.
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
// Activation rows per wide tile, which the host gives large launches of passes of more than
// MMT_TOKENS rows: a warp takes two n8 slices of activation rows, each weight fragment, scale
// and minimum decoded once for both, and a block stages its weight rows once for all sixteen
// (two tiles of eight stage and decode them twice each).
#define MMT_WIDE_TOKENS 16
#ifndef MMT_WARPS
#define MMT_WARPS 4
#endif
#define MMT_BLOCK_ROWS (MMT_WARPS * MMT_ROWS)
#ifndef MMT_STAGES
#define MMT_STAGES 2
#endif
// A stage holds the block's weight rows (as their format lays them out below), then the tile
// of activations: each row's high part (256 bytes, padded), the low parts, then per row its
// scales and sums (8 groups of 16 bytes).
#define MMT_X_STRIDE 288
#define MMT_S_STRIDE 144
// The offsets in a tile of TOKENS activation rows, and its size.
template <int TOKENS> struct TileLayout {
    static constexpr int X_HI = 0;
    static constexpr int X_LO = TOKENS * MMT_X_STRIDE;
    static constexpr int SCALES = 2 * TOKENS * MMT_X_STRIDE;
    static constexpr int BYTES = SCALES + TOKENS * MMT_S_STRIDE;
};
// The dynamic shared memory of the wide tiles' kernels (the host's MMT_WIDE_SHARED_BYTES): the
// stages of sixteen rows with Q6_K weights pass the 48 KB a kernel may declare statically.
#define MMT_WIDE_SHARED (54 * 1024)
// Q4_K: a row's 144-byte block, padded.
#define MMT_Q4_K_STRIDE 160
#define MMT_Q4_K_TILE (MMT_BLOCK_ROWS * MMT_Q4_K_STRIDE)
// Q6_K: blocks are 210 bytes, only 2-byte aligned, so a row's block comes as the 14 aligned
// 16-byte words that cover it, starting `skew` bytes into the first (padded: distinct banks);
// the rows' skews follow the rows.
#define MMT_Q6_K_WORDS 14
#define MMT_Q6_K_STRIDE 240
#define MMT_Q6_K_SKEWS (MMT_BLOCK_ROWS * MMT_Q6_K_STRIDE)
#define MMT_Q6_K_TILE (MMT_Q6_K_SKEWS + MMT_BLOCK_ROWS)

// c = BIASED_ZERO + a . b over 32 columns: a 16 x 32 (row), b 32 x 8 (column), in the fragment
// layout of PTX's m16n8k32 .s8 mma (lane = 4 * group + t: a0, a2 row `group`, a1, a3 row
// group + 8, each four columns 4t.. and 16 + 4t..; b0, b1 the same columns of column `group`).
static __device__ __forceinline__ void mma_k32(int c[4], const int a[4], int b0, int b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(BIASED_ZERO));
}

// c = a . b over 16 columns, in the layout of m16n8k16 .s8: a_g row `group`, a_g8 row group + 8,
// each four columns 4t..; b the same columns of column `group`.
static __device__ __forceinline__ void mma_k16(int c[4], int a_g, int a_g8, int b) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%7, %7, %7, %7};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a_g), "r"(a_g8), "r"(b), "r"(0));
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

// The weight row whose pieces this thread stages, of the block's rows row0.. (the last row
// repeated past `rows`): each row has two threads, which take every other 16-byte piece. The
// row is the same for every super-block, so a stage's copies need no address arithmetic but
// the super-block's offset (a division and a clamp per piece made staging a fifth of the
// loop's instructions).
static_assert(MMT_WARPS * WARP_SIZE == 2 * MMT_BLOCK_ROWS, "two threads stage each row");
static_assert(MMT_Q6_K_WORDS % 2 == 0, "a Q6_K row's words split between its two threads");
static __device__ __forceinline__ int staged_row(int row0, int rows) {
    return min(row0 + (int)threadIdx.x / 2, rows - 1);
}

// Copies super-block blk of the block's rows row0.. (the last row repeated past `rows`) into a
// stage.
static __device__ __forceinline__ void stage_q4_k_weights(uint8_t *stage, const uint8_t *w,
                                                          int row0, int rows,
                                                          unsigned long long row_bytes,
                                                          unsigned blk) {
    constexpr int PIECES = BlockQ4_K::BYTES / 16;
    const uint8_t *from =
        w + (size_t)staged_row(row0, rows) * row_bytes + (size_t)blk * BlockQ4_K::BYTES;
    uint8_t *to = stage + threadIdx.x / 2 * MMT_Q4_K_STRIDE;
#pragma unroll
    for (int k = 0; k < (PIECES + 1) / 2; k++) {
        const int piece = 2 * k + threadIdx.x % 2;
        if (piece < PIECES) {
            copy16_async(to + 16 * piece, from + 16 * piece);
        }
    }
}

// Copies the activations of super-block blk for rows t0.. into a stage's tile of TOKENS rows:
// their PARTS parts (q8.cuh: the high one alone where the activations were quantized in one),
// and per group of 32 (d_hi, d_lo, sum of the first 16, sum of the second 16). Thread
// 16 * r + piece copies piece `piece` of the parts of rows r, r + 8, ... and one of their scale
// and sum pairs.
template <int PARTS, int TOKENS>
static __device__ __forceinline__ void stage_activations(uint8_t *stage, const signed char *x_hi,
                                                         const signed char *x_lo,
                                                         const float2 *x_scales,
                                                         const float *x_sums, int cols,
                                                         int t0, int tokens, unsigned blk) {
    using Layout = TileLayout<TOKENS>;
    constexpr int ROWS_AT_ONCE = MMT_WARPS * WARP_SIZE / 16;
    static_assert(TOKENS % ROWS_AT_ONCE == 0, "every thread stages the same rows of a tile");
    const int piece = threadIdx.x % 16, g = piece / 2, sums = piece % 2;
#pragma unroll
    for (int tok = threadIdx.x / 16; tok < TOKENS; tok += ROWS_AT_ONCE) {
        if (t0 + tok >= tokens) {
            return;
        }
        const size_t at = (size_t)(t0 + tok) * cols + 256 * blk + 16 * piece;
        uint8_t *to = stage + tok * MMT_X_STRIDE + 16 * piece;
        copy16_async(to + Layout::X_HI, x_hi + at);
        if (PARTS == 2) {
            copy16_async(to + Layout::X_LO, x_lo + at);
        }
        const size_t group = (size_t)(t0 + tok) * (cols / SPAN) + 8 * blk + g;
        copy8_async(stage + Layout::SCALES + tok * MMT_S_STRIDE + 16 * g + 8 * sums,
                    sums ? (const void *)(x_sums + 2 * group) : (const void *)(x_scales + group));
    }
}

// The integer products of sub-block `sub` of a staged super-block (pa, pb: this lane's bytes
// of its chunk of nibbles in rows `group` and group + 8) with each of the PARTS parts of the
// tile's activation rows, SLICES slices of eight, in the mma's layout: ch[4 s..], cl[4 s..]
// hold rows group and group + 8 times activation rows 8 s + 2t and 8 s + 2t + 1 (cl zeros with
// one part, as the products with a low part of zeros would be). The weights' fragment is
// decoded once for all slices.
template <int PARTS, int SLICES>
static __device__ __forceinline__ void sub_block_products(const uint8_t *stage, uint2 pa,
                                                          uint2 pb, unsigned sub, int group,
                                                          int t, int ch[4 * SLICES],
                                                          int cl[4 * SLICES]) {
    using Layout = TileLayout<MMT_TOKENS * SLICES>;
    const unsigned shift = 4 * (sub % 2);
    const int a[4] = {(int)((pa.x >> shift) & 0x0F0F0F0F), (int)((pb.x >> shift) & 0x0F0F0F0F),
                      (int)((pa.y >> shift) & 0x0F0F0F0F), (int)((pb.y >> shift) & 0x0F0F0F0F)};
#pragma unroll
    for (int s = 0; s < SLICES; s++) {
        const uint8_t *x = stage + MMT_Q4_K_TILE + Layout::X_HI +
                           (MMT_TOKENS * s + group) * MMT_X_STRIDE + 32 * sub + 8 * t;
        const int2 xh = *(const int2 *)x;
        mma_k32(ch + 4 * s, a, xh.x, xh.y);
        if (PARTS == 2) {
            const int2 xl = *(const int2 *)(x + Layout::X_LO - Layout::X_HI);
            mma_k32(cl + 4 * s, a, xl.x, xl.y);
        } else {
#pragma unroll
            for (int k = 0; k < 4; k++) {
                cl[4 * s + k] = 0;
            }
        }
    }
}

// The rows of this lane in a staged super-block, rows `group` and group + 8 of the warp's 16:
// for each sub-block, `use(sub, ch, cl, sc_a, m_a, sc_b, m_b, d)` with its integer products
// with SLICES slices of activation rows (sub_block_products), the two rows' 6-bit scales and
// minimums, and their (d, dmin, d, dmin), which it also returns.
template <int PARTS = 2, int SLICES = 1, typename Use>
static __device__ __forceinline__ float4 for_each_sub_block(const uint8_t *stage, int warp,
                                                           int group, int t, Use use) {
    const uint8_t *ra = stage + (MMT_ROWS * warp + group) * MMT_Q4_K_STRIDE;
    const uint8_t *rb = ra + 8 * MMT_Q4_K_STRIDE;
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
            int ch[4 * SLICES], cl[4 * SLICES];
            sub_block_products<PARTS, SLICES>(stage, pa, pb, sub, group, t, ch, cl);
            int sc_a, m_a, sc_b, m_b;
            scale_min_k4_words(qa, sub, &sc_a, &m_a);
            scale_min_k4_words(qb, sub, &sc_b, &m_b);
            use(sub, ch, cl, sc_a, m_a, sc_b, m_b, d);
        }
    }
    return d;
}

// With one activation part (q8.cuh) d_lo is +0, so the low part's term of a value below is a
// zero, and d_hi * (its high part's sum) is never -0 (d_hi is +0 only for a group of zeros, whose
// sum is +0): adding the zero changes no bit, and the one-part values leave it out.

// The value of one Q4_K sub-block of 32 weights times 32 activations: from the integer dot
// products of its quants with each activation part (from BIASED_ZERO), its 6-bit scale and
// minimum, the block's d and dmin, the activations' (d_hi, d_lo) and the sum of their 32
// values. Spelled with rounding intrinsics: the streamed matmul and its one-row kernel compute
// it alike.
template <int PARTS>
static __device__ __forceinline__ float q4_k_sub_block_value(float d, float dmin, float sc,
                                                            float m, float2 x, float x_sum,
                                                            int dot_hi, int dot_lo) {
    const float v =
        PARTS == 2
            ? __fmaf_rn(x.x, unbiased_float(dot_hi), __fmul_rn(x.y, unbiased_float(dot_lo)))
            : __fmul_rn(x.x, unbiased_float(dot_hi));
    return __fmaf_rn(__fmul_rn(d, sc), v, -__fmul_rn(__fmul_rn(dmin, m), x_sum));
}

// The value of one Q6_K sub-block of 32 weights times 32 activations: from the block's d, the
// activations' (d_hi, d_lo), and per part the halves' integer dot products (quants q - 32)
// times their 8-bit scales, added: at most 2 * 16 * 32 * 128 * 128 = 2^24 in magnitude, so
// converted exactly.
template <int PARTS>
static __device__ __forceinline__ float q6_k_sub_block_value(float d, float2 x, int scaled_hi,
                                                            int scaled_lo) {
    const float hi = __int2float_rn(scaled_hi);
    return __fmul_rn(d, PARTS == 2 ? __fmaf_rn(x.x, hi, __fmul_rn(x.y, __int2float_rn(scaled_lo)))
                                   : __fmul_rn(x.x, hi));
}

// Four quants of Q6_K quarter `quarter` of a half, as the signed bytes q - 32: from a word of
// its low nibbles (ql) and the matching word of high bit pairs (qh), whose pairs a rotation
// puts at bits 4 and 5 of their bytes. Adding 0x60 to a byte q < 64 carries into no other, and
// flipping the sum's top bit leaves q + 0xE0, that is q - 32 modulo 256.
static __device__ __forceinline__ int q6_k_quants(unsigned ql, unsigned qh, unsigned quarter) {
    const unsigned high = __funnelshift_r(qh, qh, 2 * quarter + 28) & 0x30303030;
    const unsigned q = ((ql >> (4 * (quarter / 2))) & 0x0F0F0F0F) | high;
    return (int)((q + 0x60606060) ^ 0x80808080);
}

// A lane's four outputs, added as the one-row kernel's warp adds a row (mmt_row_<format>): a
// turn of four super-blocks (32 sub-blocks, one per lane there) is a pairwise tree, sub-blocks
// paired first, then pairs, and so on, the butterfly of its warp reduction, with +0 for absent
// super-blocks; the turns of a range are added in order. SubBlockTree adds a super-block's
// sub-blocks, TurnSums the super-blocks, each for a lane's OUTPUTS outputs.
template <int OUTPUTS> struct SubBlockTree {
    // The pending nodes: the even sub-block, the first pair of four, the first four.
    float even[OUTPUTS], pair[OUTPUTS], four[OUTPUTS];
    // Takes sub-block `sub`'s values (sub-blocks in order); after the eighth, the super-block's
    // are in `value`.
    __device__ __forceinline__ void add(unsigned sub, const float v[OUTPUTS],
                                        float value[OUTPUTS]) {
#pragma unroll
        for (int k = 0; k < OUTPUTS; k++) {
            if (sub % 2 == 0) {
                even[k] = v[k];
                continue;
            }
            const float p = __fadd_rn(even[k], v[k]);
            if (sub % 4 == 1) {
                pair[k] = p;
                continue;
            }
            const float q = __fadd_rn(pair[k], p);
            if (sub == 3) {
                four[k] = q;
            } else {
                value[k] = __fadd_rn(four[k], q);
            }
        }
    }
};

template <int OUTPUTS> struct TurnSums {
    float total[OUTPUTS] = {}, even[OUTPUTS], pair[OUTPUTS];
    // The next super-block's place in its turn (the same in every lane of the block).
    int at = 0;
    // Takes the outputs' values of the next super-block.
    __device__ __forceinline__ void add(const float value[OUTPUTS]) {
#pragma unroll
        for (int k = 0; k < OUTPUTS; k++) {
            if (at == 0 || at == 2) {
                even[k] = value[k];
            } else if (at == 1) {
                pair[k] = __fadd_rn(even[k], value[k]);
            } else {
                total[k] = __fadd_rn(total[k], __fadd_rn(pair[k], __fadd_rn(even[k], value[k])));
            }
        }
        at = (at + 1) % 4;
    }
    // Completes a partial last turn.
    __device__ __forceinline__ void finish() {
        const float zero[OUTPUTS] = {};
        while (at != 0) {
            add(zero);
        }
    }
};

// The activations of sub-block `sub` for this lane's outputs in slice `s` of a staged tile whose
// scales and sums start at `scales`: activation rows 8 s + 2t and 8 s + 2t + 1, each one's
// (d_hi, d_lo) and the sum of its 32 values.
struct SubBlockActivations {
    float2 x[2];
    float sum[2];
};
static __device__ __forceinline__ SubBlockActivations sub_block_activations(const uint8_t *scales,
                                                                           int s, int t,
                                                                           unsigned sub) {
    SubBlockActivations a;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int got = MMT_TOKENS * s + 2 * t + k;
        const float4 v = *(const float4 *)(scales + got * MMT_S_STRIDE + 16 * sub);
        a.x[k] = make_float2(v.x, v.y);
        a.sum[k] = __fadd_rn(v.z, v.w);
    }
    return a;
}

// A staged Q4_K super-block's values for this lane's outputs: rows `group` and group + 8 of
// the warp's 16 times activation rows 8 s + 2t and 8 s + 2t + 1 of each of the tile's SLICES
// slices of eight, four per slice.
template <int PARTS, int SLICES>
static __device__ __forceinline__ void q4_k_superblock(const uint8_t *stage, int warp,
                                                       int group, int t, float *value) {
    using Layout = TileLayout<MMT_TOKENS * SLICES>;
    const uint8_t *scales = stage + MMT_Q4_K_TILE + Layout::SCALES;
    SubBlockTree<4 * SLICES> tree;
    for_each_sub_block<PARTS, SLICES>(stage, warp, group, t,
                       [&](unsigned sub, const int *ch, const int *cl, int sc_a, int m_a,
                           int sc_b, int m_b, float4 d) {
        float v[4 * SLICES];
#pragma unroll
        for (int s = 0; s < SLICES; s++) {
            const SubBlockActivations x = sub_block_activations(scales, s, t, sub);
            const int *h = ch + 4 * s, *l = cl + 4 * s;
            v[4 * s] = q4_k_sub_block_value<PARTS>(d.x, d.y, sc_a, m_a, x.x[0], x.sum[0], h[0],
                                                   l[0]);
            v[4 * s + 1] = q4_k_sub_block_value<PARTS>(d.x, d.y, sc_a, m_a, x.x[1], x.sum[1],
                                                       h[1], l[1]);
            v[4 * s + 2] = q4_k_sub_block_value<PARTS>(d.z, d.w, sc_b, m_b, x.x[0], x.sum[0],
                                                       h[2], l[2]);
            v[4 * s + 3] = q4_k_sub_block_value<PARTS>(d.z, d.w, sc_b, m_b, x.x[1], x.sum[1],
                                                       h[3], l[3]);
        }
        tree.add(sub, v, value);
    });
}

// Copies Q6_K super-block blk of the block's rows row0.. (the last row repeated past `rows`)
// into a stage, with each row's skew.
static __device__ __forceinline__ void stage_q6_k_weights(uint8_t *stage, const uint8_t *w,
                                                          int row0, int rows,
                                                          unsigned long long row_bytes,
                                                          unsigned blk) {
    const int r = threadIdx.x / 2;
    const uint8_t *block =
        w + (size_t)staged_row(row0, rows) * row_bytes + (size_t)blk * BlockQ6_K::BYTES;
    const unsigned skew = (unsigned)((size_t)block % 16);
    uint8_t *to = stage + r * MMT_Q6_K_STRIDE;
#pragma unroll
    for (int k = 0; k < MMT_Q6_K_WORDS / 2; k++) {
        const int word = 2 * k + threadIdx.x % 2;
        copy16_async(to + 16 * word, block - skew + 16 * word);
    }
    if (threadIdx.x % 2 == 0) {
        stage[MMT_Q6_K_SKEWS + r] = (uint8_t)skew;
    }
}

// Bytes [at, at + 4) of a staged row (at even): two aligned words, shifted together.
static __device__ __forceinline__ unsigned staged_word(const uint8_t *row, unsigned at) {
    const unsigned *words = (const unsigned *)row + at / 4;
    return __funnelshift_r(words[0], words[1], 8 * (at % 4));
}

// A staged Q6_K super-block's values for this lane's outputs, as q4_k_superblock's. Lane
// (group, t) feeds columns 16h + 4t.. of each half h of a sub-block: the bytes at the same
// places of its rows' low nibbles and high bit pairs, and of the activations.
template <int PARTS, int SLICES>
static __device__ __forceinline__ void q6_k_superblock(const uint8_t *stage, int warp,
                                                       int group, int t, float *value) {
    using Layout = TileLayout<MMT_TOKENS * SLICES>;
    const uint8_t *tile = stage + MMT_Q6_K_TILE;
    const int in_a = MMT_ROWS * warp + group, in_b = in_a + 8;
    const uint8_t *ra = stage + in_a * MMT_Q6_K_STRIDE, *rb = stage + in_b * MMT_Q6_K_STRIDE;
    const unsigned skew_a = stage[MMT_Q6_K_SKEWS + in_a], skew_b = stage[MMT_Q6_K_SKEWS + in_b];
    const float d[4] = {load_f16(ra + skew_a + 208), load_f16(ra + skew_a + 208),
                        load_f16(rb + skew_b + 208), load_f16(rb + skew_b + 208)};
    unsigned scales_a[4], scales_b[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        scales_a[i] = staged_word(ra, skew_a + 192 + 4 * i);
        scales_b[i] = staged_word(rb, skew_b + 192 + 4 * i);
    }
    SubBlockTree<4 * SLICES> tree;
#pragma unroll
    for (unsigned n = 0; n < 2; n++) {
        // Per half h: the high bit pairs, and the low nibbles of quarters 0 and 2 (s = 0) and
        // 1 and 3 (s = 1).
        unsigned qh_a[2], qh_b[2], ql_a[2][2], ql_b[2][2];
#pragma unroll
        for (unsigned h = 0; h < 2; h++) {
            qh_a[h] = staged_word(ra, skew_a + 128 + 32 * n + 16 * h + 4 * t);
            qh_b[h] = staged_word(rb, skew_b + 128 + 32 * n + 16 * h + 4 * t);
#pragma unroll
            for (unsigned s = 0; s < 2; s++) {
                ql_a[s][h] = staged_word(ra, skew_a + 64 * n + 32 * s + 16 * h + 4 * t);
                ql_b[s][h] = staged_word(rb, skew_b + 64 * n + 32 * s + 16 * h + 4 * t);
            }
        }
#pragma unroll
        for (unsigned quarter = 0; quarter < 4; quarter++) {
            const unsigned sub = 4 * n + quarter;
            // Per half: the products with each part of each slice, then scaled by the half's
            // scale; the weights' fragments decoded once for all slices.
            int scaled_hi[4 * SLICES] = {}, scaled_lo[4 * SLICES] = {};
#pragma unroll
            for (unsigned h = 0; h < 2; h++) {
                const int a = q6_k_quants(ql_a[quarter % 2][h], qh_a[h], quarter);
                const int b = q6_k_quants(ql_b[quarter % 2][h], qh_b[h], quarter);
                const unsigned scale = 8 * n + 2 * quarter + h;
                const int sc_a = (signed char)(scales_a[scale / 4] >> (8 * (scale % 4)));
                const int sc_b = (signed char)(scales_b[scale / 4] >> (8 * (scale % 4)));
                const int sc[4] = {sc_a, sc_a, sc_b, sc_b};
#pragma unroll
                for (int s = 0; s < SLICES; s++) {
                    const uint8_t *x = tile + Layout::X_HI +
                                       (MMT_TOKENS * s + group) * MMT_X_STRIDE + 32 * sub + 4 * t;
                    int ch[4], cl[4] = {0, 0, 0, 0};
                    mma_k16(ch, a, b, *(const int *)(x + 16 * h));
                    if (PARTS == 2) {
                        mma_k16(cl, a, b, *(const int *)(x + Layout::X_LO - Layout::X_HI + 16 * h));
                    }
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        scaled_hi[4 * s + k] += sc[k] * ch[k];
                        scaled_lo[4 * s + k] += sc[k] * cl[k];
                    }
                }
            }
            float v[4 * SLICES];
#pragma unroll
            for (int s = 0; s < SLICES; s++) {
                const SubBlockActivations x =
                    sub_block_activations(tile + Layout::SCALES, s, t, sub);
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    v[4 * s + k] = q6_k_sub_block_value<PARTS>(d[k], x.x[k % 2],
                                                               scaled_hi[4 * s + k],
                                                               scaled_lo[4 * s + k]);
                }
            }
            tree.add(sub, v, value);
        }
    }
}

// A tile of TOKENS_ activation rows of a format on the backend's activations (groups of 32),
// which a stage holds after the format's weight rows (`WEIGHT_BYTES`): how a stage holds both,
// how a staged super-block is multiplied (`superblock`), and how a lane's super-block values
// (TOKENS_ / 2 outputs) are added. The block below takes it or any other such policy
// (tests/cuda/mmt measures others).
template <int WEIGHT_BYTES, int PARTS, int TOKENS_,
          void (*stage_rows)(uint8_t *, const uint8_t *, int, int, unsigned long long, unsigned),
          void (*superblock)(const uint8_t *, int, int, int, float *)>
struct Tile32 {
    const signed char *hi, *lo;
    const float2 *scales;
    const float *sums;
    static constexpr int TOKENS = TOKENS_;
    static constexpr int STAGE_BYTES = WEIGHT_BYTES + TileLayout<TOKENS>::BYTES;
    using Sums = TurnSums<TOKENS / 2>;
    static __device__ void stage_weights(uint8_t *to, const uint8_t *w, int row0, int rows,
                                         unsigned long long row_bytes, unsigned blk) {
        stage_rows(to, w, row0, rows, row_bytes, blk);
    }
    __device__ void stage(uint8_t *to, int cols, int t0, int tokens, unsigned blk) const {
        stage_activations<PARTS, TOKENS>(to + WEIGHT_BYTES, hi, lo, scales, sums, cols, t0,
                                         tokens, blk);
    }
    __device__ void multiply(const uint8_t *stage, int warp, int group, int t,
                             Sums &into) const {
        float value[TOKENS / 2];
        superblock(stage, warp, group, t, value);
        into.add(value);
    }
};

// A format's tile of TOKENS activation rows quantized in PARTS parts.
template <int PARTS, int TOKENS>
using Q4KTile = Tile32<MMT_Q4_K_TILE, PARTS, TOKENS, stage_q4_k_weights,
                       q4_k_superblock<PARTS, TOKENS / MMT_TOKENS>>;
template <int PARTS, int TOKENS>
using Q6KTile = Tile32<MMT_Q6_K_TILE, PARTS, TOKENS, stage_q6_k_weights,
                       q6_k_superblock<PARTS, TOKENS / MMT_TOKENS>>;

// The row blocks of a part of `rows` rows.
static __device__ __forceinline__ int row_blocks_of(int rows) {
    return (rows + MMT_BLOCK_ROWS - 1) / MMT_BLOCK_ROWS;
}

// Block (row block, range, tile) of grid.x, row blocks first: streams its range's super-blocks,
// then writes its outputs, or with several ranges its partial sums, of which the last block
// of the row block and tile to finish adds all in range order. `part` is the launch's first
// matrix; row blocks continue into `second` and `third` (chosen by comparisons, not by
// indexing an array, which would put the parts in memory). `stages` is the kernel's shared
// memory, MMT_STAGES * Tile::STAGE_BYTES at least, 16-byte aligned.
template <typename Tile>
static __device__ __forceinline__ void mmt_block(MatvecPart part, const MatvecPart second,
                                                 const MatvecPart third,
                                                 unsigned long long row_bytes, int cols,
                                                 const Tile &x, int tokens, int ksplit,
                                                 float *partials, unsigned *counters,
                                                 uint8_t *stages) {
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
    const int rows = part.rows, row0 = local * MMT_BLOCK_ROWS, t0 = tile * Tile::TOKENS;
    const unsigned blocks = cols / 256, per_range = (blocks + ksplit - 1) / ksplit;
    const unsigned first = range * per_range, last_blk = min(blocks, first + per_range);
    const int n = last_blk > first ? (int)(last_blk - first) : 0;
    START_NEXT_KERNEL();
#pragma unroll
    for (int i = 0; i < MMT_STAGES - 1; i++) {
        if (i < n) {
            Tile::stage_weights(stages + i * Tile::STAGE_BYTES, part.w, row0, rows, row_bytes,
                                first + i);
        }
    }
    WAIT_FOR_PREVIOUS_KERNEL();
#pragma unroll
    for (int i = 0; i < MMT_STAGES - 1; i++) {
        if (i < n) {
            x.stage(stages + i * Tile::STAGE_BYTES, cols, t0, tokens, first + i);
        }
        commit_copies();
    }
    typename Tile::Sums sums;
#pragma unroll 1
    for (int i = 0; i < n; i++) {
        wait_copies<MMT_STAGES - 2>();
        __syncthreads();
        const int next = i + MMT_STAGES - 1;
        if (next < n) {
            uint8_t *stage = stages + (next % MMT_STAGES) * Tile::STAGE_BYTES;
            Tile::stage_weights(stage, part.w, row0, rows, row_bytes, first + next);
            x.stage(stage, cols, t0, tokens, first + next);
        }
        commit_copies();
        x.multiply(stages + (i % MMT_STAGES) * Tile::STAGE_BYTES, warp, group, t, sums);
    }
    sums.finish();
    // This lane's outputs: rows `group` and group + 8 of the warp's 16 times activation rows
    // 8 s + 2t and 8 s + 2t + 1 of each slice s of the tile, as the mma lays them out.
    constexpr int TOKENS = Tile::TOKENS, OUTPUTS = TOKENS / 2;
    float acc[OUTPUTS];
    int in_block[OUTPUTS], got[OUTPUTS];
#pragma unroll
    for (int k = 0; k < OUTPUTS; k++) {
        acc[k] = sums.total[k];
        in_block[k] = MMT_ROWS * warp + group + 8 * (k % 4 / 2);
        got[k] = MMT_TOKENS * (k / 4) + 2 * t + k % 2;
    }
    if (ksplit > 1) {
        // Partial sums: [tile][range][row block][row in block][activation row in tile].
        const size_t range_len = (size_t)row_blocks * MMT_BLOCK_ROWS * TOKENS;
        float *tile_partials = partials + (size_t)tile * ksplit * range_len +
                               (size_t)row_block * MMT_BLOCK_ROWS * TOKENS;
#pragma unroll
        for (int k = 0; k < OUTPUTS; k++) {
            tile_partials[range * range_len + in_block[k] * TOKENS + got[k]] = acc[k];
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
        for (int k = 0; k < OUTPUTS; k++) {
            float sum = 0.0f;
            for (int r = 0; r < ksplit; r++) {
                sum = __fadd_rn(sum, __ldcg(tile_partials + r * range_len +
                                            in_block[k] * TOKENS + got[k]));
            }
            acc[k] = sum;
        }
        if (threadIdx.x == 0) {
            *counter = 0;
        }
    }
#pragma unroll
    for (int k = 0; k < OUTPUTS; k++) {
        const int row = row0 + in_block[k], tok = t0 + got[k];
        if (row < rows && tok < tokens) {
            part.out[(size_t)tok * rows + row] =
                part.bias ? __fadd_rn(acc[k], part.bias[row]) : acc[k];
        }
    }
}

// The one-row kernel of the streamed matmul's bits, for decode steps and passes of up to
// MMT_ROW_MAX_ROWS activation rows. A warp takes one range of one row (MMT_ROW_WARPS rows per
// block without ranges; with them, a block per row and a warp per range, the ranges being the
// streamed matmul's for the same launch). Per turn, lane i takes sub-block i % 8 of super-block
// i / 8 of the next four: its weights loaded and decoded once (RowSubBlock), then for each
// activation row `Format::value`, from its quants and its 32 activations of each part; the
// warp's butterfly (offsets 1 to 16) adds the turn's 32 values as TurnSums does, and the turns
// are added in order, for each row apart. Ranges are added in order by the row's first warp,
// then the bias, as the streamed matmul's last block adds them. ROWS bounds the pass's rows: a
// pass of one row (decode) takes an instance of its own, whose loop holds one row's
// instructions (with one loop for both, decode ran 2-3% slower on an H100), and passes of up to
// MMT_ROW_MAX_ROWS another. Taking four rows so lost to the tiles at three and four.
#define MMT_ROW_WARPS 4
#define MMT_ROW_MAX_RANGES 16
#define MMT_ROW_MAX_ROWS 2

// The sum of `value` over each group of WIDTH lanes (a power of two), in every lane of the
// group: the butterfly whose order TurnSums follows.
template <int WIDTH> static __device__ __forceinline__ float butterfly_sum(float value) {
#pragma unroll
    for (int offset = 1; offset < WIDTH; offset <<= 1) {
        value = __fadd_rn(value, SHFL_XOR(value, offset));
    }
    return value;
}

// Weights w, of sub-block `sub` of a row whose sub-blocks are numbered from 0 as `group`, times
// the same columns of one row of quantized activations, x. The activations' offsets are
// 32-bit, each one multiply-add from its row's pointer: a row's 64-bit offsets rebuilt for
// every sub-block were a fifth of the one-row kernels' instructions.
template <typename Format>
static __device__ __forceinline__ float times_activations(const typename Format::Weights &w,
                                                          unsigned sub, unsigned group,
                                                          const QuantizedRow &x) {
    return Format::value(w, sub, (const uint8_t *)(x.hi + SPAN * group),
                         (const uint8_t *)(x.lo + SPAN * group), x.scales[group],
                         x.sums + 2 * group);
}

// A lane's sub-block of one turn of a row: sub-block `sub` of super-block blk, its weights
// loaded and decoded as its format multiplies them, once for all of a pass's activation rows
// (and so that the first turns' can come before the wait for the previous kernel, as the
// matvec's first spans do), or absent (value 0).
template <typename Format> struct RowSubBlock {
    typename Format::Weights weights;
    unsigned blk;
    bool present;
    __device__ __forceinline__ RowSubBlock() : blk(0), present(false) {}
    __device__ __forceinline__ RowSubBlock(const uint8_t *w_row, unsigned blk, unsigned sub,
                                           bool present)
        : blk(blk), present(present) {
        if (present) {
            weights = Format::weights(w_row + blk * Format::BYTES, sub);
        }
    }
    // Its value with activation row x.
    __device__ __forceinline__ float value(unsigned sub, const QuantizedRow &x) const {
        return present ? times_activations<Format>(weights, sub, 8 * blk + sub, x) : 0.0f;
    }
};

// A lane's sub-block `weights` times each of a pass's `tokens` activation rows (at most
// ROWS), each value given to add(tok, value): the weights are loaded and decoded once for all.
template <int ROWS, typename Format, typename Add>
static __device__ __forceinline__ void for_each_row(const RowSubBlock<Format> &weights,
                                                    unsigned sub, const QuantizedRow &x,
                                                    int cols, int tokens, Add add) {
#pragma unroll
    for (int tok = 0; tok < ROWS; tok++) {
        if (tok < tokens) {
            add(tok, weights.value(sub, activation_row(x, cols, tok)));
        }
    }
}

// Row `row` of `part` for activation row tok: its sum, then the bias.
static __device__ __forceinline__ void write_row_sum(const MatvecPart &part, int row, int tok,
                                                     float sum) {
    part.out[(size_t)tok * part.rows + row] = part.bias ? __fadd_rn(sum, part.bias[row]) : sum;
}

template <typename Format, int ROWS>
static __device__ __forceinline__ void mmt_row(MatvecPart part, const MatvecPart second,
                                               const MatvecPart third,
                                               unsigned long long row_bytes, int cols,
                                               const signed char *x_hi, const signed char *x_lo,
                                               const float2 *x_scales, const float *x_sums,
                                               int tokens, int ksplit) {
    __shared__ float partials[ROWS][MMT_ROW_MAX_RANGES];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int rows_per_block = ksplit == 1 ? MMT_ROW_WARPS : 1;
    const int range = ksplit == 1 ? 0 : warp;
    int row = blockIdx.x * rows_per_block + (ksplit == 1 ? warp : 0);
    const bool has_row = locate_row<3>(part, second, third, row);
    const unsigned blocks = cols / 256, per_range = (blocks + ksplit - 1) / ksplit;
    const unsigned first = range * per_range, last_blk = min(blocks, first + per_range);
    const uint8_t *w_row = has_row ? part.w + (size_t)row * row_bytes : nullptr;
    START_NEXT_KERNEL();
    if (has_row && first < last_blk) {
        prefetch_l2(w_row, (unsigned long long)first * Format::BYTES,
                    (unsigned long long)last_blk * Format::BYTES);
    }
    WAIT_FOR_PREVIOUS_KERNEL();
    const unsigned sub = lane % 8;
    const QuantizedRow x = {x_hi, x_lo, x_scales, x_sums};
    float acc[ROWS];
#pragma unroll
    for (int tok = 0; tok < ROWS; tok++) {
        acc[tok] = 0.0f;
    }
    for (unsigned base = first; base < last_blk; base += 4) {
        const unsigned blk = base + lane / 8;
        const RowSubBlock<Format> weights(w_row, blk, sub, has_row && blk < last_blk);
        for_each_row<ROWS>(weights, sub, x, cols, tokens, [&](int tok, float value) {
            acc[tok] = __fadd_rn(acc[tok], butterfly_sum<WARP_SIZE>(value));
        });
    }
    if (ksplit > 1) {
        if (lane == 0) {
#pragma unroll
            for (int tok = 0; tok < ROWS; tok++) {
                partials[tok][range] = acc[tok];
            }
        }
        __syncthreads();
        if (warp == 0) {
#pragma unroll
            for (int tok = 0; tok < ROWS; tok++) {
                acc[tok] = 0.0f;
                for (int r = 0; r < ksplit; r++) {
                    acc[tok] = __fadd_rn(acc[tok], partials[tok][r]);
                }
            }
        }
    }
    if (has_row && range == 0 && lane == 0) {
#pragma unroll
        for (int tok = 0; tok < ROWS; tok++) {
            if (tok < tokens) {
                write_row_sum(part, row, tok, acc[tok]);
            }
        }
    }
}

// The one-row kernel for rows cut into ranges of at most two super-blocks (mmt_ranges_<format>,
// the host's choice there: the small matrices of a model, whose few row blocks the streamed
// matmul cuts most, such as the 1.5B's q, k, v and o, four ranges of two super-blocks on the
// H200). mmt_row would give each row a block whose warps take a range each on half their
// lanes and add them through shared memory; here a warp takes a row, each half of it a range
// (lane i of the half as lane i of mmt_row's warp), two ranges a turn. A half adds its range's
// values by a butterfly over its 16 lanes; mmt_row's last level would add the other half's
// lanes, whose super-blocks are past the range: +0 (which only turns -0 into +0), added here
// too. The row's ranges are then added in order, as mmt_row's first warp adds them. TURNS
// turns' weights are loaded before the wait for the previous kernel (the 1.5B's rows of six
// super-blocks take two). mmt_row does not load its first turn so: in the down projection's
// blocks of eight warps it cost registers (Q6_K 51 to 76 at sm_90) and time (16.5 to 19.3 us
// a launch under ncu on the H200).
template <typename Format, int TURNS>
static __device__ __forceinline__ void mmt_row_ranges(MatvecPart part, const MatvecPart second,
                                                      const MatvecPart third,
                                                      unsigned long long row_bytes, int cols,
                                                      const signed char *x_hi,
                                                      const signed char *x_lo,
                                                      const float2 *x_scales,
                                                      const float *x_sums, int tokens,
                                                      int ksplit) {
    constexpr int HALF = WARP_SIZE / 2;
    const int lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    const bool has_row = locate_row<3>(part, second, third, row);
    const unsigned blocks = cols / 256, per_range = (blocks + ksplit - 1) / ksplit;
    const unsigned in_range = lane % HALF / 8, sub = lane % 8;
    const uint8_t *w_row = has_row ? part.w + (size_t)row * row_bytes : nullptr;
    // This lane's super-block in turn j: of range 2j + (lane / 16), and whether it is one of
    // the range's (then also one of the row's).
    const auto blk_of = [&](int j) { return (2 * j + lane / HALF) * per_range + in_range; };
    const auto in_row = [&](int j) {
        return has_row && in_range < per_range && blk_of(j) < blocks;
    };
    START_NEXT_KERNEL();
    if (has_row) {
        prefetch_l2(w_row, 0, (unsigned long long)blocks * Format::BYTES);
    }
    const int turns = ksplit / 2;
    RowSubBlock<Format> first[TURNS];
#pragma unroll
    for (int j = 0; j < TURNS; j++) {
        first[j] = RowSubBlock<Format>(w_row, blk_of(j), sub, j < turns && in_row(j));
    }
    WAIT_FOR_PREVIOUS_KERNEL();
    const QuantizedRow x = {x_hi, x_lo, x_scales, x_sums};
    for (int tok = 0; tok < tokens; tok++) {
        const QuantizedRow x_row = activation_row(x, cols, tok);
        float sum = 0.0f;
        // The turn's two ranges, each the sum of its one turn from 0, added to the row's.
        const auto add_turn = [&](float value) {
            const float range_sum = __fadd_rn(0.0f, __fadd_rn(butterfly_sum<HALF>(value), 0.0f));
            sum = __fadd_rn(sum, SHFL(range_sum, 0));
            sum = __fadd_rn(sum, SHFL(range_sum, HALF));
        };
#pragma unroll
        for (int j = 0; j < TURNS; j++) {
            if (j < turns) {
                add_turn(first[j].value(sub, x_row));
            }
        }
        for (int j = TURNS; j < turns; j++) {
            add_turn(RowSubBlock<Format>(w_row, blk_of(j), sub, in_row(j)).value(sub, x_row));
        }
        if (has_row && lane == 0) {
            write_row_sum(part, row, tok, sum);
        }
    }
}

// Blocks per SM the paired kernel is compiled for (at most 64 registers a thread).
#ifndef MMT_PAIR_BLOCKS
#define MMT_PAIR_BLOCKS 8
#endif

// Rows of 4k + 2 super-blocks not cut into ranges, two per warp (mmt_pair_<format>, the host's
// choice for launches of many such rows, whose last turn would leave half a warp idle): a
// warp takes rows a and b, a's k turns as above, then one turn whose first half is a's last two
// super-blocks and whose second half is b's first two, then k turns over b's super-blocks
// 4j + 2 to 4j + 5. Each half is added by a butterfly over its 16 lanes, and b's turns are put
// back together from the halves (the second half of one turn, the first of the next), so each
// row adds the same values in the same order as a warp of its own. A pass's rows share each
// sub-block's weights, and ROWS bounds them, as in mmt_row.
template <typename Format, int ROWS>
static __device__ __forceinline__ void mmt_row_pair(
    const MatvecPart &parts, const MatvecPart &second, const MatvecPart &third,
    unsigned long long row_bytes, int cols, const signed char *x_hi, const signed char *x_lo,
    const float2 *x_scales, const float *x_sums, int tokens) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    int row_a = (blockIdx.x * MMT_ROW_WARPS + warp) * 2, row_b = row_a + 1;
    MatvecPart part_a = parts, part_b = parts;
    const bool has_a = locate_row<3>(part_a, second, third, row_a);
    const bool has_b = locate_row<3>(part_b, second, third, row_b);
    const unsigned blocks = cols / 256, turns = blocks / 4;
    const uint8_t *w_a = has_a ? part_a.w + (size_t)row_a * row_bytes : nullptr;
    const uint8_t *w_b = has_b ? part_b.w + (size_t)row_b * row_bytes : nullptr;
    START_NEXT_KERNEL();
    if (has_a) {
        prefetch_l2(w_a, 0, (unsigned long long)blocks * Format::BYTES);
    }
    if (has_b) {
        prefetch_l2(w_b, 0, (unsigned long long)blocks * Format::BYTES);
    }
    WAIT_FOR_PREVIOUS_KERNEL();
    const unsigned sub = lane % 8;
    // The first turn's weights are not loaded before the wait, as mmt_row_ranges' are: held
    // across it, they made this kernel spill at its 64 registers.
    const QuantizedRow x = {x_hi, x_lo, x_scales, x_sums};
    // Super-block blk of a row (absent where there is no row) times each activation row.
    const auto for_each_row_of = [&](const uint8_t *w_row, bool has, unsigned blk, auto add) {
        for_each_row<ROWS>(RowSubBlock<Format>(w_row, blk, sub, has), sub, x, cols, tokens, add);
    };
    float acc_a[ROWS], acc_b[ROWS], first_half[ROWS];
#pragma unroll
    for (int tok = 0; tok < ROWS; tok++) {
        acc_a[tok] = 0.0f;
        acc_b[tok] = 0.0f;
    }
    for (unsigned base = 0; base < 4 * turns; base += 4) {
        for_each_row_of(w_a, has_a, base + lane / 8, [&](int tok, float value) {
            acc_a[tok] = __fadd_rn(acc_a[tok], butterfly_sum<WARP_SIZE>(value));
        });
    }
    const bool of_b = lane >= WARP_SIZE / 2;
    for_each_row_of(of_b ? w_b : w_a, of_b ? has_b : has_a,
                    of_b ? lane / 8 - 2 : 4 * turns + lane / 8, [&](int tok, float value) {
        const float halves = butterfly_sum<WARP_SIZE / 2>(value);
        acc_a[tok] = __fadd_rn(acc_a[tok], __fadd_rn(SHFL(halves, 0), 0.0f));
        first_half[tok] = SHFL(halves, WARP_SIZE / 2);
    });
    for (unsigned j = 0; j < turns; j++) {
        for_each_row_of(w_b, has_b, 4 * j + 2 + lane / 8, [&](int tok, float value) {
            const float halves = butterfly_sum<WARP_SIZE / 2>(value);
            acc_b[tok] = __fadd_rn(acc_b[tok], __fadd_rn(first_half[tok], SHFL(halves, 0)));
            first_half[tok] = SHFL(halves, WARP_SIZE / 2);
        });
    }
#pragma unroll
    for (int tok = 0; tok < ROWS; tok++) {
        if (tok < tokens && lane == 0) {
            if (has_a) {
                write_row_sum(part_a, row_a, tok, acc_a[tok]);
            }
            if (has_b) {
                const float last = __fadd_rn(first_half[tok], 0.0f);
                write_row_sum(part_b, row_b, tok, __fadd_rn(acc_b[tok], last));
            }
        }
    }
}

// a . b + c over four bytes, a's unsigned and b's signed.
static __device__ __forceinline__ int dp4a_unsigned_signed(unsigned a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// Sub-block `sub` of the Q4_K block at b: its 32 quants (the low or high nibbles of its
// chunk's 32 bytes, eight words), 6-bit scale and minimum, and the block's d and dmin; times 32
// activations of each of PARTS parts (hi, lo: 16-byte aligned), their (d_hi, d_lo) and their
// sums of 16, eight DP4A per part. With one part (q8.cuh), lo is zeros, and its products are
// taken as the zeros they are. The nibbles are masked where they lie, not shifted down: a high
// nibble's products come out 16 times their value, a multiple of 16 that one exact shift of
// each dot product divides back, two shifts where eight were.
template <int PARTS> struct Q4KRow {
    static constexpr int BYTES = BlockQ4_K::BYTES;
    struct Weights {
        unsigned quants[8];
        float sc, m;
        unsigned d_dmin;
    };
    static __device__ __forceinline__ Weights weights(const uint8_t *b, unsigned sub) {
        const uint4 head = *(const uint4 *)b;
        const unsigned q[3] = {head.y, head.z, head.w};
        const unsigned scale_min = scale_min_k4_pair(q, sub);
        const unsigned nibbles = 0x0F0F0F0Fu << (4 * (sub % 2));
        const uint4 *chunk = (const uint4 *)(b + 16 + 32 * (sub / 2));
        const uint4 first = chunk[0], second = chunk[1];
        const unsigned quants[8] = {first.x,  first.y,  first.z,  first.w,
                                    second.x, second.y, second.z, second.w};
        Weights w;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            w.quants[i] = quants[i] & nibbles;
        }
        w.sc = byte_float(scale_min, 0);
        w.m = byte_float(scale_min, 1);
        w.d_dmin = head.x;
        return w;
    }
    static __device__ __forceinline__ float value(const Weights &w, unsigned sub,
                                                  const uint8_t *hi, const uint8_t *lo, float2 x,
                                                  const float *sums) {
        int h[8], l[8];
        load16(hi, h);
        load16(hi + 16, h + 4);
        if (PARTS == 2) {
            load16(lo, l);
            load16(lo + 16, l + 4);
        }
        // From 0, not BIASED_ZERO: ptxas folds the bias in either way, and starting there
        // made mmt_pair_q4_k spill at its 64 registers.
        int dot_hi = 0, dot_lo = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            dot_hi = dp4a_unsigned_signed(w.quants[i], h[i], dot_hi);
            if (PARTS == 2) {
                dot_lo = dp4a_unsigned_signed(w.quants[i], l[i], dot_lo);
            }
        }
        const unsigned shift = 4 * (sub % 2);
        return q4_k_sub_block_value<PARTS>(half_of(w.d_dmin, false), half_of(w.d_dmin, true),
                                           w.sc, w.m, x, __fadd_rn(sums[0], sums[1]),
                                           BIASED_ZERO + (dot_hi >> shift),
                                           BIASED_ZERO + (dot_lo >> shift));
    }
};

// Sub-block `sub` of the 2-byte aligned Q6_K block at b, as Q4KRow's: quarter sub % 4 of half
// sub / 4, its 32 bytes of low nibbles and of high bit pairs as 32 quants q - 32, the two 8-bit
// scales of its halves and the block's d; four DP4A per half and part. Each run of 32 bytes
// comes as the nine aligned words that cover it (the ninth inside the block: the runs end 18
// bytes or more before it), a word put back together from two by one byte permute.
template <int PARTS> struct Q6KRow {
    static constexpr int BYTES = BlockQ6_K::BYTES;
    struct Weights {
        int quants[8];
        int sc_a, sc_b;
        float d;
    };
    static __device__ __forceinline__ Weights weights(const uint8_t *b, unsigned sub) {
        const unsigned n = sub / 4, quarter = sub % 4;
        const unsigned skew = (unsigned)((size_t)b % 4);
        const unsigned *words = (const unsigned *)(b - skew);
        const unsigned realign = skew ? 0x5432 : 0x3210;
        const unsigned *ql = words + 16 * n + 8 * (quarter % 2), *qh = words + 32 + 8 * n;
        Weights w;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            w.quants[i] = q6_k_quants(__byte_perm(ql[i], ql[i + 1], realign),
                                      __byte_perm(qh[i], qh[i + 1], realign), quarter);
        }
        const unsigned short scales = *(const unsigned short *)(b + 192 + 8 * n + 2 * quarter);
        w.sc_a = (signed char)(scales & 0xFF);
        w.sc_b = (signed char)(scales >> 8);
        w.d = __half2float(__ushort_as_half(*(const unsigned short *)(b + 208)));
        return w;
    }
    static __device__ __forceinline__ float value(const Weights &w, unsigned, const uint8_t *hi,
                                                  const uint8_t *lo, float2 x, const float *) {
        int h[8], l[8];
        load16(hi, h);
        load16(hi + 16, h + 4);
        if (PARTS == 2) {
            load16(lo, l);
            load16(lo + 16, l + 4);
        }
        int dot_hi[2] = {0, 0}, dot_lo[2] = {0, 0};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            dot_hi[i / 4] = DP4A(w.quants[i], h[i], dot_hi[i / 4]);
            if (PARTS == 2) {
                dot_lo[i / 4] = DP4A(w.quants[i], l[i], dot_lo[i / 4]);
            }
        }
        return q6_k_sub_block_value<PARTS>(w.d, x, w.sc_a * dot_hi[0] + w.sc_b * dot_hi[1],
                                           w.sc_a * dot_lo[0] + w.sc_b * dot_lo[1]);
    }
};

// The parameters of the streamed matmul's kernels: up to three matrices of `row_bytes` rows of
// `cols` columns (MatvecPart's fields, absent ones empty) and `tokens` rows of quantized
// activations; MMT_PARTS makes them MatvecParts, MMT_ARGS passes them on.
#define MMT_PARAMS                                                                                 \
    const uint8_t *w0, int rows0, const float *bias0, float *out0, const uint8_t *w1, int rows1,   \
        const float *bias1, float *out1, const uint8_t *w2, int rows2, const float *bias2,         \
        float *out2, unsigned long long row_bytes, int cols, const signed char *x_hi,              \
        const signed char *x_lo, const float2 *x_scales, const float *x_sums, int tokens
#define MMT_PARTS {w0, rows0, bias0, out0}, {w1, rows1, bias1, out1}, {w2, rows2, bias2, out2}
#define MMT_ARGS                                                                                   \
    w0, rows0, bias0, out0, w1, rows1, bias1, out1, w2, rows2, bias2, out2, row_bytes, cols, x_hi, \
        x_lo, x_scales, x_sums, tokens

// The BYTES of stages of a wide tile's kernel: its dynamic shared memory, of which the host
// gives each launch MMT_WIDE_SHARED bytes. A launch given fewer would write past them, so it
// stops with an error instead.
template <unsigned BYTES> static __device__ __forceinline__ uint8_t *wide_stages() {
    static_assert(BYTES <= MMT_WIDE_SHARED, "a wide tile's stages fit the host's allowance");
    extern __shared__ __align__(16) uint8_t dynamic_shared[];
    unsigned given;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(given));
    if (given < BYTES) {
        __trap();
    }
    return dynamic_shared;
}

// The streamed matmul of a format (its tiles, as mmt_<name>, its wide tiles, as
// mmt_wide_<name>, its one-row kernel, as mmt_row_<name>, that kernel with rows two per warp,
// as mmt_pair_<name>, and with a warp per row cut into short ranges, as mmt_ranges_<name>)
// over up to three matrices, on activations quantized in PARTS parts. Each format has
// instances for activations in two parts and in one (<name> ending in _single).
#define MMT_INSTANCES(name, Format, PARTS)                                                         \
    extern "C" __global__ void __launch_bounds__(MMT_WARPS *WARP_SIZE)                             \
        mmt_##name(MMT_PARAMS, int ksplit, float *partials, unsigned *counters) {                  \
        using Tile = Format##Tile<PARTS, MMT_TOKENS>;                                              \
        __shared__ __align__(16) uint8_t stages[MMT_STAGES * Tile::STAGE_BYTES];                   \
        mmt_block(MMT_PARTS, row_bytes, cols, Tile{x_hi, x_lo, x_scales, x_sums}, tokens, ksplit,  \
                  partials, counters, stages);                                                     \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(MMT_WARPS *WARP_SIZE)                             \
        mmt_wide_##name(MMT_PARAMS, int ksplit, float *partials, unsigned *counters) {             \
        using Tile = Format##Tile<PARTS, MMT_WIDE_TOKENS>;                                         \
        mmt_block(MMT_PARTS, row_bytes, cols, Tile{x_hi, x_lo, x_scales, x_sums}, tokens, ksplit,  \
                  partials, counters, wide_stages<MMT_STAGES * Tile::STAGE_BYTES>());              \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(MMT_ROW_MAX_RANGES *WARP_SIZE)                    \
        mmt_row_##name(MMT_PARAMS, int ksplit) {                                                   \
        using Row = Format##Row<PARTS>;                                                            \
        if (tokens == 1) {                                                                         \
            mmt_row<Row, 1>(MMT_PARTS, row_bytes, cols, x_hi, x_lo, x_scales, x_sums, 1, ksplit);  \
        } else {                                                                                   \
            mmt_row<Row, MMT_ROW_MAX_ROWS>(MMT_PARTS, row_bytes, cols, x_hi, x_lo, x_scales,       \
                                           x_sums, tokens, ksplit);                                \
        }                                                                                          \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(MMT_ROW_WARPS *WARP_SIZE)                         \
        mmt_ranges_##name(MMT_PARAMS, int ksplit) {                                                \
        mmt_row_ranges<Format##Row<PARTS>, 2>(MMT_PARTS, row_bytes, cols, x_hi, x_lo, x_scales,    \
                                              x_sums, tokens, ksplit);                             \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(MMT_ROW_WARPS *WARP_SIZE, MMT_PAIR_BLOCKS)        \
        mmt_pair_##name(MMT_PARAMS) {                                                              \
        using Row = Format##Row<PARTS>;                                                            \
        if (tokens == 1) {                                                                         \
            mmt_row_pair<Row, 1>(MMT_PARTS, row_bytes, cols, x_hi, x_lo, x_scales, x_sums, 1);     \
        } else {                                                                                   \
            mmt_row_pair<Row, MMT_ROW_MAX_ROWS>(MMT_PARTS, row_bytes, cols, x_hi, x_lo, x_scales,  \
                                                x_sums, tokens);                                   \
        }                                                                                          \
    }
MMT_INSTANCES(q4_k, Q4K, 2)
MMT_INSTANCES(q6_k, Q6K, 2)
MMT_INSTANCES(q4_k_single, Q4K, 1)
MMT_INSTANCES(q6_k_single, Q6K, 1)

// The streamed matmul over three matrices of which the third is in another format (a Q4_K_M
// file's q and k in Q4_K, and in half its layers v in Q6_K), so that they take one launch, as
// mmv_q8_mixed does for the matvec: the tiles (mmt_mixed_<format>_<third format>, and
// mmt_wide_mixed_... for wide tiles) and, for rows cut into ranges of at most two super-blocks,
// the host's only use of it, the one-row kernel (mmt_ranges_mixed_...). A block (tiles) or warp
// (one row) runs its rows' format: the first two parts' blocks see an empty third part with
// the third's row blocks, and the third's an empty part with the first two's, so that every
// block finds its row block, range and tile, and the partial sums their places, as in a launch
// of one format. The third's rows are (cols / 256) * ThirdRow::BYTES long.
template <typename Tile, typename ThirdTile, typename ThirdRow>
static __device__ __forceinline__ void mmt_mixed_block(MMT_PARAMS, int ksplit, float *partials,
                                                       unsigned *counters, uint8_t *stages) {
    const int blocks_before = row_blocks_of(rows0) + row_blocks_of(rows1);
    const int before_third = blocks_before * MMT_BLOCK_ROWS;
    const int row_blocks = blocks_before + row_blocks_of(rows2);
    const MatvecPart none = {nullptr, 0, nullptr, nullptr};
    if ((int)(blockIdx.x % row_blocks) * MMT_BLOCK_ROWS < before_third) {
        const MatvecPart after = {nullptr, row_blocks_of(rows2) * MMT_BLOCK_ROWS, nullptr,
                                  nullptr};
        mmt_block({w0, rows0, bias0, out0}, {w1, rows1, bias1, out1}, after, row_bytes, cols,
                  Tile{x_hi, x_lo, x_scales, x_sums}, tokens, ksplit, partials, counters,
                  stages);
    } else {
        mmt_block({nullptr, before_third, nullptr, nullptr}, none, {w2, rows2, bias2, out2},
                  (unsigned long long)(cols / 256) * ThirdRow::BYTES, cols,
                  ThirdTile{x_hi, x_lo, x_scales, x_sums}, tokens, ksplit, partials, counters,
                  stages);
    }
}

// The larger of two tiles' stages.
template <typename A, typename B> __host__ __device__ constexpr int larger_stage() {
    return A::STAGE_BYTES > B::STAGE_BYTES ? A::STAGE_BYTES : B::STAGE_BYTES;
}

#define MMT_MIXED_INSTANCES(name, Format, Third, PARTS)                                            \
    extern "C" __global__ void __launch_bounds__(MMT_WARPS *WARP_SIZE)                             \
        mmt_mixed_##name(MMT_PARAMS, int ksplit, float *partials, unsigned *counters) {            \
        using Tile = Format##Tile<PARTS, MMT_TOKENS>;                                              \
        using ThirdTile = Third##Tile<PARTS, MMT_TOKENS>;                                          \
        __shared__ __align__(16) uint8_t stages[MMT_STAGES * larger_stage<Tile, ThirdTile>()];     \
        mmt_mixed_block<Tile, ThirdTile, Third##Row<PARTS>>(MMT_ARGS, ksplit, partials, counters,  \
                                                            stages);                               \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(MMT_WARPS *WARP_SIZE)                             \
        mmt_wide_mixed_##name(MMT_PARAMS, int ksplit, float *partials, unsigned *counters) {       \
        using Tile = Format##Tile<PARTS, MMT_WIDE_TOKENS>;                                         \
        using ThirdTile = Third##Tile<PARTS, MMT_WIDE_TOKENS>;                                     \
        constexpr unsigned BYTES = MMT_STAGES * larger_stage<Tile, ThirdTile>();                   \
        mmt_mixed_block<Tile, ThirdTile, Third##Row<PARTS>>(MMT_ARGS, ksplit, partials, counters,  \
                                                            wide_stages<BYTES>());                 \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(MMT_ROW_WARPS *WARP_SIZE)                         \
        mmt_ranges_mixed_##name(MMT_PARAMS, int ksplit) {                                          \
        const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;           \
        const MatvecPart none = {nullptr, 0, nullptr, nullptr};                                    \
        if (row < rows0 + rows1) {                                                                 \
            mmt_row_ranges<Format##Row<PARTS>, 2>({w0, rows0, bias0, out0},                        \
                                                  {w1, rows1, bias1, out1}, none, row_bytes,       \
                                                  cols, x_hi, x_lo, x_scales, x_sums, tokens,      \
                                                  ksplit);                                         \
        } else {                                                                                   \
            mmt_row_ranges<Third##Row<PARTS>, 2>(                                                  \
                {nullptr, rows0 + rows1, nullptr, nullptr}, {w2, rows2, bias2, out2}, none,        \
                (unsigned long long)(cols / 256) * Third##Row<PARTS>::BYTES, cols, x_hi, x_lo,     \
                x_scales, x_sums, tokens, ksplit);                                                 \
        }                                                                                          \
    }
MMT_MIXED_INSTANCES(q4_k_q6_k, Q4K, Q6K, 2)
MMT_MIXED_INSTANCES(q4_k_q6_k_single, Q4K, Q6K, 1)

#endif
