// The backend's f16 GEMM instances (kernels/cuda/gemm.cu) as the standalone benches launch
// them: each tile shape, (activation rows, weight rows) a block, and a launch of one tile over
// m activation rows and n weight rows of k columns. tests/cuda/gemm/bench.cu and
// tests/cuda/prefill/bench.cu include it after gemm.cu.
#pragma once

using GemmKernel = void (*)(const __half *, const __half *, const float *, int, int, int,
                           float *);
struct Tile {
    int rows, weight_rows;
    GemmKernel kernel;
};
constexpr Tile TILES[] = {{64, 64, gemm_f16_64x64},
                          {64, 128, gemm_f16_64x128},
                          {128, 64, gemm_f16_128x64},
                          {128, 128, gemm_f16_128x128}};
constexpr int TILE_COUNT = 4;

static void gemm(int tile, const __half *x, const __half *w, int m, int n, int k, float *out) {
    const Tile &t = TILES[tile];
    const int blocks = (m + t.rows - 1) / t.rows * ((n + t.weight_rows - 1) / t.weight_rows);
    t.kernel<<<blocks, GEMM_THREADS>>>(x, w, nullptr, m, n, k, out);
}
