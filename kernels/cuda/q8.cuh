// Activations quantized for the matvec's integer dot products, in two parts as on the CPU
// (crates/quant/src/activation): each 32 consecutive values x of a row become a high part
// hi = round(x / d_hi), d_hi = amax(x) / 127, and a low part quantizing what it leaves,
// lo = round((x - d_hi * hi) / d_lo), d_lo = amax(x - d_hi * hi) / 127, so that a value is
// d_hi * hi + d_lo * lo, within d_lo / 2 of x. A single 8-bit part loses too much on models
// with outlier activations (SmolLM2, Qwen2.5-0.5B: see the README). Each 16 consecutive values
// also get d_hi * sum(hi) + d_lo * sum(lo), for the weight formats with an offset. Parts,
// scales and sums live in separate arrays, so that a span's 16 bytes load aligned.
//
// A model may quantize in the high part alone (ActivationPrecision::Single, llama.cpp's 8-bit
// activations): lo stays the zeros it was allocated as, d_lo is 0, and the kernels that know it
// skip the low part's products (mmt.cu's _single instances), which being zeros add nothing.
//
// The kernels whose output feeds a matvec (rms_norm, silu_mul) quantize it as they write it;
// quantize_q8 (quantize.cu) does it for any other matvec input.
#pragma once

#include "common.cuh"

// Where a quantized copy goes: hi and lo per value, (d_hi, d_lo) per 32 and one sum per 16;
// lo null for the high part alone.
struct QuantizedOut {
    signed char *hi, *lo;
    float2 *scales;
    float *sums;
};

// Below this largest magnitude a part is zero (crates/quant: 127 * f32::MIN_POSITIVE).
#define SMALLEST_AMAX (127.0f * 1.17549435e-38f)

// On CUDA from sm_80 (every architecture the build targets), a warp's integer sums and maxima
// are one `redux` instruction each instead of a chain of shuffles, which the norms' and
// silu_mul's quantization waits on group after group. Both are exact, so the bits are those of
// the shuffles.
#if !defined(__HIP__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define WARP_REDUX 1
#endif

// The sum of quant v (at most 127 in magnitude) over each half-warp (lanes 0..16 and 16..32);
// every lane gets its half's.
static __device__ __forceinline__ int half_warp_sum(int v) {
#ifdef WARP_REDUX
    // The high half's quants count 65,536 times: the warp's sum is low + 65,536 * high, and
    // each half's sum (at most 2,032 in magnitude) comes back exactly.
    const bool high = threadIdx.x % WARP_SIZE >= 16;
    const int both = __reduce_add_sync(0xffffffffu, high ? v * 65536 : v);
    const int low = (short)(both & 0xffff);
    return high ? (both - low) >> 16 : low;
#else
#pragma unroll
    for (int offset = 8; offset > 0; offset >>= 1) {
        v += SHFL_XOR(v, offset);
    }
    return v;
#endif
}

// The largest magnitude of v over the warp.
static __device__ __forceinline__ float warp_amax(float v) {
#ifdef WARP_REDUX
    // Non-negative floats order as their bits do.
    return __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(fabsf(v))));
#else
    return warp_max(fabsf(v));
#endif
}

// One part of value v: its quant and the group's scale.
static __device__ __forceinline__ int quantize_part(float v, float *scale) {
    const float amax = warp_amax(v);
    if (amax < SMALLEST_AMAX) {
        *scale = 0.0f;
        return 0;
    }
    *scale = amax / 127.0f;
    return __float2int_rn(v * (127.0f / amax));
}

// Quantizes value v, held by this lane of a warp whose 32 lanes hold group `group` (the 32
// consecutive values from 32 * group), into `out`.
static __device__ __forceinline__ void quantize_group(float v, long long group,
                                                      const QuantizedOut &out) {
    const int lane = threadIdx.x % WARP_SIZE;
    const long long i = group * WARP_SIZE + lane;
    float d_hi, d_lo;
    const int q_hi = quantize_part(v, &d_hi);
    int q_lo = 0;
    d_lo = 0.0f;
    if (out.lo != nullptr) {
        // Multiply then subtract, unfused, as the CPU's quantizers do.
        const float residual = __fsub_rn(v, __fmul_rn(d_hi, (float)q_hi));
        q_lo = quantize_part(residual, &d_lo);
        out.lo[i] = (signed char)q_lo;
    }
    out.hi[i] = (signed char)q_hi;
    const int sum_hi = half_warp_sum(q_hi), sum_lo = half_warp_sum(q_lo);
    if (lane == 0) {
        out.scales[group] = make_float2(d_hi, d_lo);
    }
    if (lane % 16 == 0) {
        out.sums[group * 2 + lane / 16] = d_hi * (float)sum_hi + d_lo * (float)sum_lo;
    }
}
