// GGML block formats on the device: each decoder gives element `i` of one block, read in place
// from the GGUF bytes. One struct per format; the matvec and row-gather kernels are templates
// over them, so adding a format touches this file and the instance lists only.
#pragma once

#include "common.cuh"

struct BlockF32 {
    static constexpr int QK = 1, BYTES = 4;
    static __device__ __forceinline__ float at(const uint8_t *b, int) {
        float v;
        memcpy(&v, b, 4);
        return v;
    }
};

struct BlockF16 {
    static constexpr int QK = 1, BYTES = 2;
    static __device__ __forceinline__ float at(const uint8_t *b, int) { return load_f16(b); }
};

// Elements 0..15 are the low nibbles of qs[0..16], 16..31 the high nibbles.
static __device__ __forceinline__ int nibble32(const uint8_t *qs, int i) {
    return i < 16 ? (qs[i] & 0xF) : (qs[i - 16] >> 4);
}

struct BlockQ4_0 {
    static constexpr int QK = 32, BYTES = 18;
    static __device__ __forceinline__ float at(const uint8_t *b, int i) {
        return load_f16(b) * (float)(nibble32(b + 2, i) - 8);
    }
};

struct BlockQ4_1 {
    static constexpr int QK = 32, BYTES = 20;
    static __device__ __forceinline__ float at(const uint8_t *b, int i) {
        return load_f16(b) * (float)nibble32(b + 4, i) + load_f16(b + 2);
    }
};

// The fifth bit of element i is bit i of the 32-bit qh.
static __device__ __forceinline__ int fifth_bit(const uint8_t *qh, int i) {
    return ((qh[i / 8] >> (i % 8)) & 1) << 4;
}

struct BlockQ5_0 {
    static constexpr int QK = 32, BYTES = 22;
    static __device__ __forceinline__ float at(const uint8_t *b, int i) {
        return load_f16(b) * (float)((nibble32(b + 6, i) | fifth_bit(b + 2, i)) - 16);
    }
};

struct BlockQ5_1 {
    static constexpr int QK = 32, BYTES = 24;
    static __device__ __forceinline__ float at(const uint8_t *b, int i) {
        return load_f16(b) * (float)(nibble32(b + 8, i) | fifth_bit(b + 4, i)) + load_f16(b + 2);
    }
};

struct BlockQ8_0 {
    static constexpr int QK = 32, BYTES = 34;
    static __device__ __forceinline__ float at(const uint8_t *b, int i) {
        return load_f16(b) * (float)(int8_t)b[2 + i];
    }
};

// The 6-bit scale and minimum of sub-block j (0..8) of a Q4_K or Q5_K block.
static __device__ __forceinline__ void scale_min_k4(const uint8_t *q, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// The scales and minimums, times d and dmin, of the two sub-blocks (2c and 2c+1) that share the
// 64-element chunk c of a Q4_K or Q5_K block.
struct ChunkScales {
    float d_lo, min_lo, d_hi, min_hi;
};

// The 6-bit scale (byte 0) and minimum (byte 1) of sub-block j (0..8), from the block's 12
// scale bytes held in three words (scale_min_k4 on registers): bytes j % 4 of the first two
// words side by side in one permute, for j < 4 their low six bits; for j >= 4 the third word's
// byte j % 4 split into its nibbles (a second permute), over those bytes' top two bits. Both
// forms, then a choice: the lanes of a warp take sub-blocks of both halves, and a branch would
// run each half's instructions for all of them.
static __device__ __forceinline__ unsigned scale_min_k4_pair(const unsigned q[3], unsigned j) {
    const unsigned i = j % 4, side_by_side = i | (i + 4) << 4;
    const unsigned firsts = __byte_perm(q[0], q[1], side_by_side);
    const unsigned nibbles = __byte_perm(q[2], q[2] >> 4, side_by_side) & 0x0F0F;
    return j < 4 ? firsts & 0x3F3F : nibbles | ((firsts >> 2) & 0x3030);
}

// scale_min_k4_pair's scale and minimum as integers.
static __device__ __forceinline__ void scale_min_k4_words(const unsigned q[3], unsigned j,
                                                          int *sc, int *m) {
    const unsigned pair = scale_min_k4_pair(q, j);
    *sc = (int)(pair & 0xFF);
    *m = (int)(pair >> 8);
}

// The bits of 1.5 * 2^23, where an integer that is to become a float starts: while it stays
// within 2^22 of them, the integer read as a float is 1.5 * 2^23 plus its offset exactly, and
// one subtraction (unbiased_float) gives the offset's value. The conversion instruction runs at
// an eighth of the float rate on the NVIDIA architectures we ship (16 per clock and SM); a dot
// product started there (a DP4A chain's or an mma's accumulator) costs nothing more.
#define BIASED_ZERO 0x4B400000

// The offset from BIASED_ZERO of `biased`, as a float, exactly (see BIASED_ZERO).
static __device__ __forceinline__ float unbiased_float(int biased) {
    return __fsub_rn(__int_as_float(biased), 12582912.0f);
}

// Byte i (0..3) of w as a float, exactly: one byte permute puts it under BIASED_ZERO's bits.
static __device__ __forceinline__ float byte_float(unsigned w, unsigned i) {
    return unbiased_float((int)__byte_perm((unsigned)BIASED_ZERO, w, 0x3204u | i));
}

// The block's first 16 bytes (d, dmin and the scales) in one aligned load, not byte by byte:
// Q4_K and Q5_K blocks are 144 and 176 bytes, so every block of a row is 16-byte aligned.
//
// The chunk's two scales (and two minimums) are bytes 2c and 2c + 1, or 2(c - 2) and
// 2(c - 2) + 1, of the scale words, so each pair is cut out at once (the layout of
// scale_min_k4): for chunks 0 and 1 the low six bits of the first (second) word's bytes; for
// chunks 2 and 3 the low (high) nibbles of the third word's bytes over the top two bits of the
// first (second) word's. Both forms are computed, then one chosen: the lanes of a warp take
// chunks of both halves, and a branch would run each half's instructions for all of them. The
// bytes become floats by byte_float. In the matvec this decoded the 1.5B 3-4% faster on the
// H200 than sub-block by sub-block (scale_min_k4_words, then conversion instructions); the
// tensor-core matmul (mmq.cu) ran prefill and 16 sequences 1-3% slower with it, with either
// conversion, so a kernel file that defines K4_SCALES_BY_SUB_BLOCK before including this
// header takes the scales sub-block by sub-block. Either way the values are exact, so every
// kernel gets the same bits.
static __device__ __forceinline__ ChunkScales chunk_scales_k4(const uint8_t *b, unsigned chunk) {
    const uint4 head = *(const uint4 *)b;
    const float d = __half2float(__ushort_as_half((unsigned short)(head.x & 0xFFFF)));
    const float dmin = __half2float(__ushort_as_half((unsigned short)(head.x >> 16)));
#ifdef K4_SCALES_BY_SUB_BLOCK
    const unsigned q[3] = {head.y, head.z, head.w};
    int sc_lo, m_lo, sc_hi, m_hi;
    scale_min_k4_words(q, 2 * chunk, &sc_lo, &m_lo);
    scale_min_k4_words(q, 2 * chunk + 1, &sc_hi, &m_hi);
    return {d * sc_lo, dmin * m_lo, d * sc_hi, dmin * m_hi};
#else
    const unsigned first = 16 * (chunk % 2);
    const unsigned scales_first = (head.y >> first) & 0x3F3F;
    const unsigned mins_first = (head.z >> first) & 0x3F3F;
    const unsigned scales_last = ((head.w >> first) & 0x0F0F) | ((head.y >> (first + 2)) & 0x3030);
    const unsigned mins_last =
        ((head.w >> (first + 4)) & 0x0F0F) | ((head.z >> (first + 2)) & 0x3030);
    const unsigned scales = chunk < 2 ? scales_first : scales_last;
    const unsigned mins = chunk < 2 ? mins_first : mins_last;
    return {d * byte_float(scales, 0), dmin * byte_float(mins, 0), d * byte_float(scales, 1),
            dmin * byte_float(mins, 1)};
#endif
}

// Q4_K: d, dmin (f16), 12 bytes of scales and minimums, 128 bytes of nibbles. Each 64 elements
// share 32 bytes of qs: the first 32 are their low nibbles, the next 32 their high nibbles.
struct BlockQ4_K {
    static constexpr int QK = 256, BYTES = 144;
    static __device__ __forceinline__ float at(const uint8_t *b, int i) {
        const int chunk = i / 64, half = (i % 64) / 32, l = i % 32;
        int sc, m;
        scale_min_k4(b + 4, 2 * chunk + half, &sc, &m);
        const uint8_t q = b[16 + 32 * chunk + l];
        const int v = half ? (q >> 4) : (q & 0xF);
        return load_f16(b) * (float)sc * (float)v - load_f16(b + 2) * (float)m;
    }
};

// Q5_K: as Q4_K, with a fifth bit per element in 32 bytes of qh (bit 2*chunk + half of qh[l]).
struct BlockQ5_K {
    static constexpr int QK = 256, BYTES = 176;
    static __device__ __forceinline__ float at(const uint8_t *b, int i) {
        const int chunk = i / 64, half = (i % 64) / 32, l = i % 32;
        int sc, m;
        scale_min_k4(b + 4, 2 * chunk + half, &sc, &m);
        const uint8_t q = b[48 + 32 * chunk + l];
        const int high = ((b[16 + l] >> (2 * chunk + half)) & 1) << 4;
        const int v = (half ? (q >> 4) : (q & 0xF)) | high;
        return load_f16(b) * (float)sc * (float)v - load_f16(b + 2) * (float)m;
    }
};

// Q6_K: 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 signed 8-bit scales, d (f16).
// Each 128 elements use 64 bytes of ql and 32 of qh, in four quarters of 32.
struct BlockQ6_K {
    static constexpr int QK = 256, BYTES = 210;
    static __device__ __forceinline__ float at(const uint8_t *b, int i) {
        const int n = i / 128, quarter = (i % 128) / 32, l = i % 32;
        const uint8_t ql = b[64 * n + l + 32 * (quarter & 1)];
        const int low = (ql >> (4 * (quarter >> 1))) & 0xF;
        const int high = (b[128 + 32 * n + l] >> (2 * quarter)) & 3;
        const int scale = (int8_t)b[192 + 8 * n + l / 16 + 2 * quarter];
        return load_f16(b + 208) * (float)scale * (float)((low | (high << 4)) - 32);
    }
};

// Element j of a row of blocks.
template <typename Block>
static __device__ __forceinline__ float row_at(const uint8_t *row, int j) {
    return Block::at(row + (size_t)(j / Block::QK) * Block::BYTES, j % Block::QK);
}

// X(name, Block): the formats whose matvec takes activations quantized to 8 bits (mmv.cu).
#define FOR_EACH_QUANT_FORMAT(X) \
    X(q4_0, BlockQ4_0)           \
    X(q4_1, BlockQ4_1)           \
    X(q5_0, BlockQ5_0)           \
    X(q5_1, BlockQ5_1)           \
    X(q8_0, BlockQ8_0)           \
    X(q4_k, BlockQ4_K)           \
    X(q5_k, BlockQ5_K)           \
    X(q6_k, BlockQ6_K)

// X(name, Block): the formats whose matvec takes f32 activations.
#define FOR_EACH_FLOAT_FORMAT(X) \
    X(f32, BlockF32)             \
    X(f16, BlockF16)

// X(name, Block): every format the matvec and row-gather kernels are instantiated for.
#define FOR_EACH_FORMAT(X) FOR_EACH_FLOAT_FORMAT(X) FOR_EACH_QUANT_FORMAT(X)
