// The prefill matmul of prompt rows: weights dequantized to f16 just before it, and an f16
// tensor-core GEMM with f32 accumulators whose order of additions is fixed by the matrix
// alone. Each output element is one accumulator that takes the k16 steps of its row in order,
// one mma.sync at a time, whatever the tile shape, the pass's row count or where the row sits
// in its tile, so a row's result never depends on the rows beside it: the property every
// matmul of the backend keeps (batch invariance, chunking invariance). Its bits are not the
// int8 kernels' (mmv.cu, mmt.cu), so it is meant for the rows of one class only, prompt
// tokens, every generated token's row staying on the int8 kernels (README, "Prefill through an
// f16 GEMM"; the backend launches it where the host profile's `prompt_gemm` asks for it).
//
// out[m][n] = sum_k x[m][k] * w[n][k] (+ bias[n]): x is the pass's activations (f16, rows of
// k), w the dequantized weight rows (f16, rows of k), out f32 rows of n, as the backend lays
// them out. Shared by gemm.cu (the backend's instances) and tests/cuda/gemm/bench.cu.
//
// The mma instructions exist from sm_80; HIP builds none of this (crates/backend/build.rs).
#pragma once

#include "mma.cuh"
#include "quant.cuh"

// Eight consecutive elements of a row of blocks from column `col` (a multiple of 8), each the
// value Block::at gives. The formats of the models' large matrices read their sub-block's
// scales once and their quants in wide loads; the others take Block::at eight times.
template <typename Block> struct Dequantize8 {
    static __device__ __forceinline__ void at(const uint8_t *row, int col, float v[8]) {
#pragma unroll
        for (int e = 0; e < 8; e++) {
            v[e] = row_at<Block>(row, col + e);
        }
    }
};

template <> struct Dequantize8<BlockQ4_K> {
    static __device__ __forceinline__ void at(const uint8_t *row, int col, float v[8]) {
        const uint8_t *b = row + (size_t)(col / BlockQ4_K::QK) * BlockQ4_K::BYTES;
        const int i = col % BlockQ4_K::QK, chunk = i / 64, half = (i % 64) / 32, l = i % 32;
        int sc, m;
        scale_min_k4(b + 4, 2 * chunk + half, &sc, &m);
        const float scale = load_f16(b) * (float)sc, minimum = load_f16(b + 2) * (float)m;
        // 144-byte blocks in rows of whole blocks: the quants of l..l+7 are 8-byte aligned.
        const uint2 quants = *reinterpret_cast<const uint2 *>(b + 16 + 32 * chunk + l);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const unsigned q = ((e < 4 ? quants.x : quants.y) >> (8 * (e % 4))) & 0xFF;
            v[e] = scale * (float)(half ? q >> 4 : q & 0xF) - minimum;
        }
    }
};

template <> struct Dequantize8<BlockQ6_K> {
    static __device__ __forceinline__ void at(const uint8_t *row, int col, float v[8]) {
        const uint8_t *b = row + (size_t)(col / BlockQ6_K::QK) * BlockQ6_K::BYTES;
        const int i = col % BlockQ6_K::QK, n = i / 128, quarter = (i % 128) / 32, l = i % 32;
        const float scale =
            load_f16(b + 208) * (float)(int8_t)b[192 + 8 * n + l / 16 + 2 * quarter];
        // 210-byte blocks are only 2-byte aligned: the quants come as pairs of bytes.
        const uint16_t *low_pairs =
            reinterpret_cast<const uint16_t *>(b + 64 * n + l + 32 * (quarter & 1));
        const uint16_t *high_pairs = reinterpret_cast<const uint16_t *>(b + 128 + 32 * n + l);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const unsigned lows = low_pairs[e / 2], highs = high_pairs[e / 2];
            const int low = (lows >> (8 * (e % 2) + 4 * (quarter >> 1))) & 0xF;
            const int high = (highs >> (8 * (e % 2) + 2 * quarter)) & 3;
            v[e] = scale * (float)((low | (high << 4)) - 32);
        }
    }
};

// Rows of blocks of `Block` to f16, eight consecutive elements a thread and one 16-byte store
// (cols must be a multiple of 8): run before each GEMM of a pass with prompt rows, into one
// scratch matrix, so that the weights stay in their GGUF blocks in memory. Element j of a row
// is Block::at's value rounded once, whatever the thread that writes it.
template <typename Block>
static __device__ void dequantize_f16(const uint8_t *__restrict__ w, unsigned long long row_bytes,
                                      int rows, int cols, __half *__restrict__ out) {
    AFTER_PREVIOUS_KERNEL();
    const long long i = 8 * ((long long)blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= (long long)rows * cols) return;
    const int row = (int)(i / cols), col = (int)(i % cols);
    float v[8];
    Dequantize8<Block>::at(w + row * row_bytes, col, v);
    __half2 values[4];
#pragma unroll
    for (int p = 0; p < 4; p++) {
        values[p] = __floats2half2_rn(v[2 * p], v[2 * p + 1]);
    }
    *reinterpret_cast<uint4 *>(out + i) = *reinterpret_cast<const uint4 *>(values);
}

// n f32 activations to f16, a thread per pair: n must be even (whole rows of an even k).
static __device__ void to_f16(const float *__restrict__ x, long long n, __half *__restrict__ out) {
    AFTER_PREVIOUS_KERNEL();
    const long long i = 2 * ((long long)blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) *reinterpret_cast<__half2 *>(out + i) = __floats2half2_rn(x[i], x[i + 1]);
}

#if !defined(__HIP__)

constexpr int GEMM_BK = 32, GEMM_THREADS = 256;
// A tile row of 32 halves padded to 40: ldmatrix's eight 16-byte rows then fall on distinct
// banks (a stride of 20 words), and every row stays 16-byte aligned for cp.async.
constexpr int GEMM_LD = GEMM_BK + 8;

// The stages of cp.async in flight for a tile: as many as fit the 48 KiB of static shared
// memory a block may have without asking the driver for more, at most four.
template <int BM, int BN> __host__ __device__ constexpr int gemm_stages() {
    const int fit = 49152 / ((BM + BN) * GEMM_LD * 2);
    return fit < 4 ? fit : 4;
}

// Blocks of BM activation rows by BN weight rows, the row blocks of one column of tiles
// adjacent in the grid (they share the weight tile in L2); eight warps, two along m by four
// along n, each BM/2 x BN/4 of the tile. k must be a multiple of 32; m and n may be anything.
template <int BM, int BN>
static __device__ void gemm_f16(const __half *__restrict__ x, const __half *__restrict__ w,
                                const float *__restrict__ bias, int m, int n, int k,
                                float *__restrict__ out) {
    constexpr int STAGES = gemm_stages<BM, BN>();
    constexpr int WM = BM / 2 / 16, WN = BN / 4 / 8; // m16 and n8 tiles per warp
    __shared__ __align__(16) __half xs[STAGES * BM * GEMM_LD], ws[STAGES * BN * GEMM_LD];
    AFTER_PREVIOUS_KERNEL();
    const int tiles_m = (m + BM - 1) / BM;
    const int m0 = blockIdx.x % tiles_m * BM, n0 = blockIdx.x / tiles_m * BN;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / 4 * (BM / 2), wn = warp % 4 * (BN / 4);

    auto load_stage = [&](int stage, int kt) {
        const int k0 = kt * GEMM_BK;
        // 16-byte chunks: four per tile row.
        for (int c = threadIdx.x; c < BM * 4; c += GEMM_THREADS) {
            const int r = c / 4, part = c % 4, row = m0 + r;
            cp_async16(xs + (stage * BM + r) * GEMM_LD + part * 8,
                       x + (size_t)min(row, m - 1) * k + k0 + part * 8, row < m);
        }
        for (int c = threadIdx.x; c < BN * 4; c += GEMM_THREADS) {
            const int r = c / 4, part = c % 4, row = n0 + r;
            cp_async16(ws + (stage * BN + r) * GEMM_LD + part * 8,
                       w + (size_t)min(row, n - 1) * k + k0 + part * 8, row < n);
        }
    };

    float acc[WM][WN][4] = {};
    const int steps = k / GEMM_BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < steps) load_stage(s, s);
        asm volatile("cp.async.commit_group;\n");
    }
    for (int kt = 0; kt < steps; kt++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
        __syncthreads();
        if (kt + STAGES - 1 < steps) load_stage((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
        asm volatile("cp.async.commit_group;\n");
        const int stage = kt % STAGES;
        const __half *xt = xs + stage * BM * GEMM_LD, *wt = ws + stage * BN * GEMM_LD;
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 16) {
            unsigned a[WM][4], b[WN / 2][4];
#pragma unroll
            for (int i = 0; i < WM; i++) {
                ldmatrix_x4(a[i], xt + (wm + 16 * i + lane % 16) * GEMM_LD + kk + lane / 16 * 8);
            }
            // Matrices 0 and 1: n 0-7 at k and k + 8; 2 and 3: n 8-15.
#pragma unroll
            for (int j = 0; j < WN / 2; j++) {
                ldmatrix_x4(b[j], wt + (wn + 16 * j + lane / 16 * 8 + lane % 8) * GEMM_LD + kk +
                                      (lane / 8) % 2 * 8);
            }
#pragma unroll
            for (int i = 0; i < WM; i++) {
#pragma unroll
                for (int j = 0; j < WN; j++) {
                    mma_f16(acc[i][j], a[i], b[j / 2][2 * (j % 2)], b[j / 2][2 * (j % 2) + 1]);
                }
            }
        }
    }
    // Accumulator c of an m16n8 tile: rows lane/4 (+8 for c2, c3), columns 2 (lane%4) (+1).
#pragma unroll
    for (int i = 0; i < WM; i++) {
#pragma unroll
        for (int j = 0; j < WN; j++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = m0 + wm + 16 * i + lane / 4 + 8 * h;
                const int col = n0 + wn + 8 * j + 2 * (lane % 4);
                if (row >= m) continue;
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    if (col + e < n) {
                        out[(size_t)row * n + col + e] =
                            acc[i][j][2 * h + e] + (bias ? bias[col + e] : 0.0f);
                    }
                }
            }
        }
    }
}

#endif
