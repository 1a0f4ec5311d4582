// Shared device helpers of the kernels: warp reductions and f16 loads.
#pragma once

#include <cstdint>

#include "../portable.cuh"

#define WARP_SIZE 32

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        v += SHFL_XOR(v, offset);
    }
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        v = fmaxf(v, SHFL_XOR(v, offset));
    }
    return v;
}

// Little-endian f16 at any byte address (GGUF blocks are byte-packed, so it may be unaligned).
static __device__ __forceinline__ float load_f16(const uint8_t *p) {
    const unsigned short bits = (unsigned short)p[0] | ((unsigned short)p[1] << 8);
    return __half2float(__ushort_as_half(bits));
}

// Asks L2 for bytes [from, to) of row, one 128-byte line per lane at a time.
static __device__ __forceinline__ void prefetch_l2(const uint8_t *row, unsigned long long from,
                                                   unsigned long long to) {
    for (unsigned long long line = from + 128 * (threadIdx.x % WARP_SIZE); line < to;
         line += 128 * WARP_SIZE) {
        PREFETCH_L2(row + line);
    }
}
