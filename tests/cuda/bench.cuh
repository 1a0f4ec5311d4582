// Host helpers of the standalone CUDA benches (tests/cuda/*/bench.cu): f16 conversions, random
// Q4_K and Q6_K matrices and activations, their elements as the device decodes them
// (BlockQ4_K::at, BlockQ6_K::at) and the check of a dequantized copy against them, the
// streamed matmul's super-block split, and a launch's time.
#pragma once

#include "check.cuh"

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

static float host_half(uint16_t h) {
    const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 31, mant = h & 1023;
    float v = exp == 0 ? std::ldexp((float)mant, -24) : std::ldexp((float)(mant | 1024), exp - 25);
    return sign ? -v : v;
}

static uint16_t to_half(float f) { return __half_as_ushort(__float2half(f)); }

// `bytes` of random Q4_K blocks whose d and dmin are small enough for products of a few
// thousand columns to stay in range.
static std::vector<uint8_t> random_q4_k(size_t bytes, std::mt19937 &rng) {
    std::vector<uint8_t> w(bytes);
    for (size_t i = 0; i < bytes; i++) w[i] = rng() & 0xFF;
    std::uniform_real_distribution<float> scale(0.5e-3f, 2e-3f);
    for (size_t b = 0; b < bytes; b += 144) {
        const uint16_t d = to_half(scale(rng)), dmin = to_half(scale(rng));
        memcpy(&w[b], &d, 2);
        memcpy(&w[b + 2], &dmin, 2);
    }
    return w;
}

// n activations, normal, with about one in 97 thirty times larger (the outlier channels of
// real hidden states).
static std::vector<float> random_activations(size_t n, std::mt19937 &rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(n);
    for (float &v : x) v = normal(rng) * (rng() % 97 == 0 ? 30.0f : 1.0f);
    return x;
}

// Element i of a Q4_K block, as BlockQ4_K::at.
static double q4_k_at(const uint8_t *b, int i) {
    const int chunk = i / 64, half = (i % 64) / 32, l = i % 32, j = 2 * chunk + half;
    const uint8_t *q = b + 4;
    int sc, m;
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
    const uint8_t v = b[16 + 32 * chunk + l];
    const int n = half ? v >> 4 : v & 0xF;
    return (double)host_half(b[0] | (b[1] << 8)) * sc * n -
           (double)host_half(b[2] | (b[3] << 8)) * m;
}

// `bytes` of random Q6_K blocks whose d is small enough for products of a few thousand
// columns to stay in range.
static std::vector<uint8_t> random_q6_k(size_t bytes, std::mt19937 &rng) {
    std::vector<uint8_t> w(bytes);
    for (size_t i = 0; i < bytes; i++) w[i] = rng() & 0xFF;
    std::uniform_real_distribution<float> scale(0.5e-5f, 2e-5f);
    for (size_t b = 0; b < bytes; b += 210) {
        const uint16_t d = to_half(scale(rng));
        memcpy(&w[b + 208], &d, 2);
    }
    return w;
}

// Element i of a Q6_K block, as BlockQ6_K::at.
static double q6_k_at(const uint8_t *b, int i) {
    const int n = i / 128, quarter = (i % 128) / 32, l = i % 32;
    const int low = (b[64 * n + l + 32 * (quarter & 1)] >> (4 * (quarter >> 1))) & 0xF;
    const int high = (b[128 + 32 * n + l] >> (2 * quarter)) & 3;
    const int scale = (int8_t)b[192 + 8 * n + l / 16 + 2 * quarter];
    return (double)host_half(b[208] | (b[209] << 8)) * scale * ((low | (high << 4)) - 32);
}

// Whether every weight of whole rows of `wh` (all of them, or about 2,048 spread over a larger
// matrix), the f16 copy of the `rows` x `cols` matrix `w` of `block_bytes`-byte blocks of 256,
// is its exact value (`at`) rounded to f16 once (half an f16 step, subnormals included) after
// the float arithmetic of the device's Block::at; prints the first that is not.
template <typename At>
static bool dequantized_weights_ok(const char *name, const std::vector<uint8_t> &w,
                                   size_t block_bytes, size_t rows, size_t cols,
                                   const std::vector<uint16_t> &wh, At at) {
    const size_t row_bytes = cols / 256 * block_bytes;
    for (size_t r = 0; r < rows; r += (rows + 2047) / 2048) {
        for (size_t c = 0; c < cols; c++) {
            const double exact = at(&w[r * row_bytes + c / 256 * block_bytes], (int)(c % 256));
            const double got = host_half(wh[r * cols + c]);
            const double bound = std::ldexp(std::fabs(exact), -11) + std::ldexp(1.0, -25) +
                                 1e-6 * std::fabs(exact);
            if (!(std::fabs(got - exact) <= bound)) {
                printf("%s: weight (%zu, %zu) dequantized to %.9g, exactly %.9g\n", name, r, c,
                       got, exact);
                return false;
            }
        }
    }
    return true;
}

// The super-block split for a matrix of `units` row blocks of `blocks` super-blocks: doubling,
// up to 16 ranges, while the launch has fewer than `target` blocks, as the backend's
// streamed_split (crates/backend/src/gpu/mod.rs) begins with the device's SMs as the target
// (it then cuts ranges longer than a turn of its one-row kernel, which these benches' kernels
// do not have, into turns).
static int split_for(int units, int blocks, int target) {
    int ksplit = 1;
    while (ksplit < 16 && 2 * ksplit <= blocks && units * ksplit < target) {
        ksplit *= 2;
    }
    return ksplit;
}

template <typename F> static float time_us(F launch, int reps) {
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < 3; i++) launch();
    CHECK(cudaEventRecord(start));
    for (int i = 0; i < reps; i++) launch();
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    CHECK(cudaGetLastError());
    return 1000.0f * ms / reps;
}
