// A weight row's spans of 32 columns, as the quantized matrix kernels (mmv.cu, mmq.cu) read
// them, and the one expression that turns a span's integer dot products with quantized
// activations (q8.cuh) into its float value. Both kernels share it and add span values in the
// same order (mmv.cu says which), so that a row's result is the same bits whichever of them,
// and however many activation rows, computed it.
#pragma once

#include "quant.cuh"

#define SPAN 32

// One of the matrices a quantized matmul launch covers (mmv.cu, mmt.cu): `rows` rows at w,
// each with its bias (if any), written to out.
struct MatvecPart {
    const uint8_t *w;
    int rows;
    const float *bias;
    float *out;
};

// The part that row `row` of the launch's parts lies in, and its row there; false past them all.
// Chosen by comparisons, not by indexing an array, which would put the parts in memory.
template <int PARTS>
static __device__ __forceinline__ bool locate_row(MatvecPart &part, const MatvecPart &second,
                                                  const MatvecPart &third, int &row) {
    if (row < part.rows) {
        return true;
    }
    if (PARTS == 1) {
        return false;
    }
    row -= part.rows;
    part = second;
    if (row < part.rows) {
        return true;
    }
    row -= part.rows;
    part = third;
    return row < part.rows;
}

// A span's 32 weights, as two runs of 16 quants packed four to an int (byte i of
// lo[k] is quant 4k + i of the run): run `lo` covers columns first..first+16 and its values are
// d_lo * q + m_lo; likewise `hi` from column second. A run never straddles a group of 32
// activations.
struct QSpan {
    int lo[4], hi[4];
    float d_lo, m_lo, d_hi, m_hi;
    // Unsigned, so that the activation indices they give are shifts, not signed divisions.
    unsigned first, second;
};

// 16 bytes from a 16-byte aligned address, as four little-endian ints.
static __device__ __forceinline__ void load16(const uint8_t *p, int w[4]) {
    const int4 v = *(const int4 *)p;
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
}

// 16 bytes from a 2-byte aligned address, as four little-endian ints: five aligned 32-bit loads
// (the fifth holds the last two bytes when the address is not 4-byte aligned, so it lies in the
// same buffer), shifted together.
static __device__ __forceinline__ void load16_unaligned(const uint8_t *p, int w[4]) {
    const unsigned *base = (const unsigned *)((size_t)p & ~(size_t)3);
    const bool odd = ((size_t)p & 2) != 0;
    unsigned u[5];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u[i] = base[i];
    }
    u[4] = odd ? base[4] : 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        w[i] = (int)(odd ? (u[i] >> 16) | (u[i + 1] << 16) : u[i]);
    }
}

// Bits 0..4 of `bits` moved to bit 4 of bytes 0..4: four elements' fifth bits.
static __device__ __forceinline__ int spread_fifth_bits(unsigned bits) {
    return (int)(((bits & 1) << 4) | ((bits & 2) << 11) | ((bits & 4) << 18) | ((bits & 8) << 25));
}

template <typename Block>
static __device__ __forceinline__ QSpan qspan(const uint8_t *row, unsigned s);

// The legacy 32-element formats: one span is one block, whose 16 bytes of quants hold element
// i in the low nibble of byte i and element 16 + i in its high nibble; the Q5 formats take each
// element's fifth bit from bit i of the 32-bit qh.
static __device__ __forceinline__ QSpan nibble_qspan(const uint8_t *qs, unsigned qh, bool fifth,
                                                     float d, float m, unsigned s) {
    int w[4];
    load16_unaligned(qs, w);
    QSpan sp;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        sp.lo[i] = (w[i] & 0x0F0F0F0F) | (fifth ? spread_fifth_bits(qh >> (4 * i)) : 0);
        sp.hi[i] = ((w[i] >> 4) & 0x0F0F0F0F) | (fifth ? spread_fifth_bits(qh >> (16 + 4 * i)) : 0);
    }
    sp.d_lo = sp.d_hi = d;
    sp.m_lo = sp.m_hi = m;
    sp.first = SPAN * s;
    sp.second = sp.first + 16;
    return sp;
}

// Q4_0: d, then the quants; value d * (q - 8). Blocks are 18 bytes.
template <>
__device__ __forceinline__ QSpan qspan<BlockQ4_0>(const uint8_t *row, unsigned s) {
    const uint8_t *b = row + (size_t)s * BlockQ4_0::BYTES;
    const float d = load_f16(b);
    return nibble_qspan(b + 2, 0, false, d, -8.0f * d, s);
}

// Q4_1: d, m, then the quants; value d * q + m. Blocks are 20 bytes.
template <>
__device__ __forceinline__ QSpan qspan<BlockQ4_1>(const uint8_t *row, unsigned s) {
    const uint8_t *b = row + (size_t)s * BlockQ4_1::BYTES;
    return nibble_qspan(b + 4, 0, false, load_f16(b), load_f16(b + 2), s);
}

// Q5_0: d, qh, then the quants; value d * (q - 16). Blocks are 22 bytes.
template <>
__device__ __forceinline__ QSpan qspan<BlockQ5_0>(const uint8_t *row, unsigned s) {
    const uint8_t *b = row + (size_t)s * BlockQ5_0::BYTES;
    const float d = load_f16(b);
    const unsigned short *qh = (const unsigned short *)(b + 2);
    return nibble_qspan(b + 6, qh[0] | ((unsigned)qh[1] << 16), true, d, -16.0f * d, s);
}

// Q5_1: d, m, qh, then the quants; value d * q + m. Blocks are 24 bytes.
template <>
__device__ __forceinline__ QSpan qspan<BlockQ5_1>(const uint8_t *row, unsigned s) {
    const uint8_t *b = row + (size_t)s * BlockQ5_1::BYTES;
    const unsigned qh = *(const unsigned *)(b + 4);
    return nibble_qspan(b + 8, qh, true, load_f16(b), load_f16(b + 2), s);
}

// Q8_0: d, then 32 signed quants; value d * q. Blocks are 34 bytes.
template <>
__device__ __forceinline__ QSpan qspan<BlockQ8_0>(const uint8_t *row, unsigned s) {
    const uint8_t *b = row + (size_t)s * BlockQ8_0::BYTES;
    QSpan sp;
    load16_unaligned(b + 2, sp.lo);
    load16_unaligned(b + 18, sp.hi);
    sp.d_lo = sp.d_hi = load_f16(b);
    sp.m_lo = sp.m_hi = 0.0f;
    sp.first = SPAN * s;
    sp.second = sp.first + 16;
    return sp;
}

// Span s of a Q4_K or Q5_K row: block s/8, 16-byte piece j = s%8 of its nibbles, which start
// `nibbles` bytes into the block: bytes 32c + l0.. (c = j/2 the 64-element chunk, l0 = 0 or
// 16) hold in their low nibbles elements 64c + l0.. of sub-block 2c, in their high nibbles the
// same places of sub-block 2c+1. With `fifth`, each element's fifth bit comes from the 32 bytes
// after the block's header: bit 2c of byte l0 + i for the low nibble, 2c+1 for the high one.
// Blocks are 144 and 176 bytes, so every piece is 16-byte aligned.
template <typename Block>
static __device__ __forceinline__ QSpan k4_qspan(const uint8_t *row, unsigned s, unsigned nibbles,
                                                 bool fifth) {
    const uint8_t *b = row + (size_t)(s / 8) * Block::BYTES;
    const unsigned j = s % 8, chunk = j / 2, l0 = 16 * (j % 2);
    const ChunkScales cs = chunk_scales_k4(b, chunk);
    QSpan sp;
    sp.d_lo = cs.d_lo;
    sp.m_lo = -cs.min_lo;
    sp.d_hi = cs.d_hi;
    sp.m_hi = -cs.min_hi;
    sp.first = 256 * (s / 8) + 64 * chunk + l0;
    sp.second = sp.first + 32;
    int w[4], h[4] = {0, 0, 0, 0};
    load16(b + nibbles + 32 * chunk + l0, w);
    if (fifth) {
        load16(b + 16 + l0, h);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        sp.lo[i] = (w[i] & 0x0F0F0F0F) | (((h[i] >> (2 * chunk)) & 0x01010101) << 4);
        sp.hi[i] = ((w[i] >> 4) & 0x0F0F0F0F) | (((h[i] >> (2 * chunk + 1)) & 0x01010101) << 4);
    }
    return sp;
}

// Q4_K: the nibbles follow the 16-byte header.
template <>
__device__ __forceinline__ QSpan qspan<BlockQ4_K>(const uint8_t *row, unsigned s) {
    return k4_qspan<BlockQ4_K>(row, s, 16, false);
}

// Q5_K: the fifth bits follow the header, then the nibbles.
template <>
__device__ __forceinline__ QSpan qspan<BlockQ5_K>(const uint8_t *row, unsigned s) {
    return k4_qspan<BlockQ5_K>(row, s, 48, true);
}

// Q6_K: span s is block s/8, piece j = s%8: half n = j/4 (128 elements), quarter m = j%4 of
// its 64 bytes of ql. Byte i of the piece holds, in its low nibble, element
// 128n + 16(m%2) + 32(m/2) + i and in its high nibble the one 64 further; their two high bits
// are bits 2(m/2) and 2(m/2) + 4 of qh[32n + 16(m%2) + i]; values are d * scale * (q - 32).
// Blocks are 210 bytes, so loads are 16-bit.
template <>
__device__ __forceinline__ QSpan qspan<BlockQ6_K>(const uint8_t *row, unsigned s) {
    const uint8_t *b = row + (size_t)(s / 8) * BlockQ6_K::BYTES;
    const unsigned j = s % 8, n = j / 4, m = j % 4;
    const unsigned shift = 2 * (m / 2);
    const float d = load_f16(b + 208);
    int ql[4], qh[4];
    load16_unaligned(b + 64 * n + 16 * m, ql);
    load16_unaligned(b + 128 + 32 * n + 16 * (m % 2), qh);
    QSpan sp;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        sp.lo[i] = (ql[i] & 0x0F0F0F0F) | (((qh[i] >> shift) & 0x03030303) << 4);
        sp.hi[i] = ((ql[i] >> 4) & 0x0F0F0F0F) | (((qh[i] >> (shift + 4)) & 0x03030303) << 4);
    }
    sp.d_lo = d * (float)(int8_t)b[192 + 8 * n + m % 2 + shift];
    sp.d_hi = d * (float)(int8_t)b[192 + 8 * n + m % 2 + shift + 4];
    sp.m_lo = -32.0f * sp.d_lo;
    sp.m_hi = -32.0f * sp.d_hi;
    sp.first = 256 * (s / 8) + 128 * n + 16 * (m % 2) + 32 * (m / 2);
    sp.second = sp.first + 64;
    return sp;
}

// One row of activations quantized in two parts (quantize.cu): the high and low bytes, the
// (d_hi, d_lo) of each 32 values and the sum of each 16.
struct QuantizedRow {
    const signed char *hi, *lo;
    const float2 *scales;
    const float *sums;
};

// Row `row` of quantized activations x of `cols` columns.
static __device__ __forceinline__ QuantizedRow activation_row(const QuantizedRow &x,
                                                              unsigned cols, unsigned row) {
    const size_t r = row;
    return {x.hi + r * cols, x.lo + r * cols, x.scales + r * (cols / SPAN),
            x.sums + r * (cols / 16)};
}

// The integer dot products of a span's two runs with one row of quantized activations: run lo
// with the high and the low part, then run hi with both, each summed from BIASED_ZERO
// (quant.cuh). Exact, however they are computed.
struct SpanDots {
    int lo_hi, lo_lo, hi_hi, hi_lo;
};

// The span's value from its dot products with activation row x: per run,
// d * (d_hi(x) * (quants . hi) + d_lo(x) * (quants . lo)) + m * (sum of the activations).
// Spelled with rounding intrinsics so that no compiler contracts or reorders it differently in
// one kernel than in another. A run's dot product is at most 16 * 127 * 128 in magnitude.
static __device__ __forceinline__ float span_value(const QSpan &sp, const SpanDots &dots,
                                                   const QuantizedRow &x) {
    const float2 x_lo = x.scales[sp.first / SPAN], x_hi = x.scales[sp.second / SPAN];
    const float lo = __fmaf_rn(x_lo.x, unbiased_float(dots.lo_hi),
                               __fmul_rn(x_lo.y, unbiased_float(dots.lo_lo)));
    const float hi = __fmaf_rn(x_hi.x, unbiased_float(dots.hi_hi),
                               __fmul_rn(x_hi.y, unbiased_float(dots.hi_lo)));
    return __fadd_rn(__fmaf_rn(sp.m_lo, x.sums[sp.first / 16], __fmul_rn(sp.d_lo, lo)),
                     __fmaf_rn(sp.m_hi, x.sums[sp.second / 16], __fmul_rn(sp.d_hi, hi)));
}
