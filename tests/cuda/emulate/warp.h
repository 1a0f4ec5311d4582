// A host emulation of the CUDA a tensor-core kernel of kernels/cuda/ is written in, so that the
// layouts of its mma fragments, its masks and the independence of its rows are checked where
// there is no GPU (CI, this repository's own machine). A block's threads run as std::threads,
// one block after another; __shared__ variables become statics (one block at a time), warp
// collectives go through per-warp slots between barriers. The instructions follow the PTX ISA's
// fragment layouts (ldmatrix, mma.m16n8k16 with f16 inputs and f32 accumulators); an mma sums
// its products in double, not as the tensor cores do, so bits checked here are the kernel's own
// logic, and tests/cuda/attention/bench.cu checks them on a GPU.
//
// A kernel family compiles against this header in place of mma.cuh and q8.cuh (tests/cuda/
// emulate/run puts copies named so beside a copy of the family).
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

using std::max;
using std::min;
typedef _Float16 __half;
struct float2 {
    float x, y;
};
static inline float2 make_float2(float x, float y) { return {x, y}; }
struct Dim3 {
    unsigned x = 0, y = 0, z = 0;
};
inline thread_local Dim3 threadIdx, blockIdx;
inline Dim3 blockDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define WARP_SIZE 32
#define START_NEXT_KERNEL() ((void)0)
#define WAIT_FOR_PREVIOUS_KERNEL() ((void)0)
#define __expf expf

// The running block's barriers, and what each lane hands its warp: SLOT words per lane.
constexpr int SLOT = 16;
struct Block {
    std::unique_ptr<std::barrier<>> all;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<uint64_t> slots;
};
inline Block running;

static inline int lane_id() { return threadIdx.x % WARP_SIZE; }
static inline void __syncthreads() { running.all->arrive_and_wait(); }
static inline void __syncwarp() { running.warps[threadIdx.x / WARP_SIZE]->arrive_and_wait(); }
// Lane `lane` of this thread's warp's words.
static inline uint64_t *slot(int lane) {
    return &running.slots[((threadIdx.x / WARP_SIZE) * WARP_SIZE + lane) * SLOT];
}

template <typename T> static T shfl_xor(T v, int offset) {
    static_assert(sizeof(T) <= sizeof(uint64_t));
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    slot(lane_id())[0] = bits;
    __syncwarp();
    bits = slot(lane_id() ^ offset)[0];
    __syncwarp();
    T out;
    memcpy(&out, &bits, sizeof(T));
    return out;
}
#define SHFL_XOR(v, offset) shfl_xor((v), (offset))

// q8.cuh's output: the tests pass none, and a kernel that quantizes anyway stops them.
struct QuantizedOut {
    signed char *hi, *lo;
    float2 *scales;
    float *sums;
};
static inline void quantize_group(float, long long, const QuantizedOut &) { abort(); }

// cp.async completes at once here.
static inline void cp_async16(void *smem, const void *global, bool valid) {
    if (valid) {
        memcpy(smem, global, 16);
    } else {
        memset(smem, 0, 16);
    }
}
static inline void cp_async_commit() {}
template <int PENDING> static inline void cp_async_wait() {}

static inline unsigned pack(__half a, __half b) {
    const __half h[2] = {a, b};
    unsigned u;
    memcpy(&u, h, sizeof u);
    return u;
}
static inline unsigned half2_bits(float a, float b) { return pack((__half)a, (__half)b); }
static inline float half_of(unsigned u, int i) {
    __half h[2];
    memcpy(h, &u, sizeof u);
    return (float)h[i];
}

// Each lane's row address, handed to the warp (ldmatrix: lanes 8m..8m+7 give matrix m's rows).
static inline const __half *row_of(int lane) { return (const __half *)(uintptr_t)slot(lane)[1]; }

static inline void ldmatrix_x4(unsigned r[4], const __half *p) {
    slot(lane_id())[1] = (uint64_t)(uintptr_t)p;
    __syncwarp();
    const int t = lane_id();
    for (int m = 0; m < 4; m++) {
        const __half *row = row_of(8 * m + t / 4);
        r[m] = pack(row[2 * (t % 4)], row[2 * (t % 4) + 1]);
    }
    __syncwarp();
}

static inline void ldmatrix_x4_trans(unsigned r[4], const __half *p) {
    slot(lane_id())[1] = (uint64_t)(uintptr_t)p;
    __syncwarp();
    const int t = lane_id();
    for (int m = 0; m < 4; m++) {
        r[m] = pack(row_of(8 * m + 2 * (t % 4))[t / 4], row_of(8 * m + 2 * (t % 4) + 1)[t / 4]);
    }
    __syncwarp();
}

// D = A B + C for A 16x16 (row), B 16x8 (col), lane t holding rows t/4 and t/4 + 8, columns
// (k) 2 (t % 4), + 1, + 8, + 9 of A, the same k of column t/4 of B, and columns 2 (t % 4), + 1
// of C's two rows.
static inline void mma_f16(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    uint64_t *mine = slot(lane_id());
    for (int i = 0; i < 4; i++) {
        mine[2 + i] = a[i];
        uint32_t bits;
        memcpy(&bits, &c[i], sizeof bits);
        mine[8 + i] = bits;
    }
    mine[6] = b0;
    mine[7] = b1;
    __syncwarp();
    float A[16][16], B[16][8], C[16][8];
    for (int t = 0; t < WARP_SIZE; t++) {
        const uint64_t *theirs = slot(t);
        const int g = t / 4, k = 2 * (t % 4);
        for (int e = 0; e < 2; e++) {
            A[g][k + e] = half_of(theirs[2], e);
            A[g + 8][k + e] = half_of(theirs[3], e);
            A[g][k + 8 + e] = half_of(theirs[4], e);
            A[g + 8][k + 8 + e] = half_of(theirs[5], e);
            B[k + e][g] = half_of(theirs[6], e);
            B[k + 8 + e][g] = half_of(theirs[7], e);
        }
        for (int i = 0; i < 4; i++) {
            const uint32_t bits = (uint32_t)theirs[8 + i];
            memcpy(&C[g + 8 * (i / 2)][k + i % 2], &bits, sizeof bits);
        }
    }
    __syncwarp();
    const int t = lane_id();
    for (int i = 0; i < 4; i++) {
        const int row = t / 4 + 8 * (i / 2), col = 2 * (t % 4) + i % 2;
        double sum = 0;
        for (int k = 0; k < 16; k++) sum += (double)A[row][k] * B[k][col];
        c[i] = (float)(sum + C[row][col]);
    }
}

// Runs `kernel` as `blocks` blocks of `threads` threads, one block after another.
static inline void launch(int blocks, int threads, const std::function<void()> &kernel) {
    blockDim.x = threads;
    running.all = std::make_unique<std::barrier<>>(threads);
    running.warps.clear();
    for (int w = 0; w < threads / WARP_SIZE; w++) {
        running.warps.push_back(std::make_unique<std::barrier<>>(WARP_SIZE));
    }
    running.slots.assign((size_t)threads * SLOT, 0);
    for (int b = 0; b < blocks; b++) {
        std::vector<std::thread> block;
        for (int t = 0; t < threads; t++) {
            block.emplace_back([&kernel, b, t] {
                blockIdx.x = b;
                threadIdx.x = t;
                kernel();
            });
        }
        for (std::thread &thread : block) thread.join();
    }
}
