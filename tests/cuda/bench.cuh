// Host helpers of the standalone CUDA benches (tests/cuda/*/bench.cu): f16 conversions, random
// Q4_K matrices and activations, Q4_K elements as the device decodes them (BlockQ4_K::at), the
// streamed matmul's super-block split, and a launch's time.
#pragma once

#include "check.cuh"

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
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

// The super-block split for a matrix of `units` row blocks of `blocks` super-blocks: doubling,
// up to 16 ranges, while the launch has fewer than `target` blocks, as the backend's
// streamed_split (crates/backend/src/gpu/mod.rs) does with the device's SMs as the target.
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
