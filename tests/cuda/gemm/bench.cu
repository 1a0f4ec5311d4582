// The backend's prefill matmul of prompt rows (kernels/cuda/gemm.cu: Q4_K weights dequantized
// to f16, then a GEMM whose order of additions is fixed by the matrix alone) on random matrices
// of the 1.5B's shapes: its error against an f64 product, whether a row's bits depend on the
// pass's row count, its place in the pass or the tile shape (they must not), and the time of
// the dequantization (which the backend runs before each GEMM) and of the GEMM at 128, 512
// and 2,048 activation rows for each of the backend's tiles. tests/cuda/gemm/bench.py times
// cuBLAS's GEMM on the same shapes.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o gemm-bench tests/cuda/gemm/bench.cu && ./gemm-bench

#include "../../../kernels/cuda/gemm.cu"
#include "../bench.cuh"
#include "tiles.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

struct Shape {
    const char *name;
    int rows, cols, per_pass;
};

int main() {
    const Shape shapes[] = {{"q,k,v", 2048, 1536, 28},
                            {"o", 1536, 1536, 28},
                            {"gate,up", 17920, 1536, 28},
                            {"down", 1536, 8960, 28},
                            {"output", 151936, 1536, 0}};
    const int max_tokens = 2048, token_counts[] = {128, 512, 2048};
    double dequant_pass_us = 0, pass_us[3][TILE_COUNT] = {}, best_pass_us[3] = {};
    std::mt19937 rng(7);
    bool ok = true;
    printf("%-8s %6s %11s", "matrix", "tokens", "dequant us");
    for (const Tile &t : TILES) printf(" %4dx%-3d us", t.rows, t.weight_rows);
    printf(" %8s | worst error: f16 operands, exact operands\n", "TFLOP/s");
    for (const Shape &s : shapes) {
        const size_t row_bytes = s.cols / 256 * 144, bytes = row_bytes * s.rows;
        const std::vector<uint8_t> w = random_q4_k(bytes, rng);
        const std::vector<float> x = random_activations((size_t)max_tokens * s.cols, rng);

        uint8_t *dw;
        float *dx, *dout, *dout2;
        __half *dwh, *dxh;
        CHECK(cudaMalloc(&dw, bytes));
        CHECK(cudaMemcpy(dw, w.data(), bytes, cudaMemcpyHostToDevice));
        CHECK(cudaMalloc(&dwh, (size_t)s.rows * s.cols * 2));
        CHECK(cudaMalloc(&dx, x.size() * 4));
        CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMalloc(&dxh, x.size() * 2));
        CHECK(cudaMalloc(&dout, (size_t)max_tokens * s.rows * 4));
        CHECK(cudaMalloc(&dout2, (size_t)max_tokens * s.rows * 4));
        const long long elements = (long long)s.rows * s.cols;
        auto dequantize = [&] {
            dequantize_f16_q4_k<<<(elements / 8 + 255) / 256, 256>>>(dw, row_bytes, s.rows,
                                                                    s.cols, dwh);
        };
        dequantize();
        activations_to_f16<<<(x.size() / 2 + 255) / 256, 256>>>(dx, (long long)x.size(), dxh);
        gemm(TILE_COUNT - 1, dxh, dwh, max_tokens, s.rows, s.cols, dout);
        CHECK(cudaDeviceSynchronize());

        // Error, on a sample of rows and tokens, against the f64 product of the f16 operands
        // and of the exact ones, relative to the sum of |w x| of the output element.
        std::vector<uint16_t> wh((size_t)s.rows * s.cols), xh(x.size());
        CHECK(cudaMemcpy(wh.data(), dwh, wh.size() * 2, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(xh.data(), dxh, xh.size() * 2, cudaMemcpyDeviceToHost));
        std::vector<float> all((size_t)max_tokens * s.rows);
        CHECK(cudaMemcpy(all.data(), dout, all.size() * 4, cudaMemcpyDeviceToHost));
        // Every dequantized weight of whole rows is its exact value rounded once.
        ok = dequantized_weights_ok(s.name, w, 144, s.rows, s.cols, wh, q4_k_at) && ok;
        double worst_f16 = 0, worst_exact = 0;
        for (int sample = 0; sample < 64; sample++) {
            const int r = (int)((long long)sample * (s.rows - 1) / 63);
            const int t = (int)(rng() % max_tokens);
            double f16_sum = 0, exact_sum = 0, magnitude = 0;
            for (int c = 0; c < s.cols; c++) {
                const double exact_w = q4_k_at(&w[r * row_bytes + c / 256 * 144], c % 256);
                const double exact_x = x[(size_t)t * s.cols + c];
                f16_sum += (double)host_half(wh[(size_t)r * s.cols + c]) *
                           host_half(xh[(size_t)t * s.cols + c]);
                exact_sum += exact_w * exact_x;
                magnitude += std::fabs(exact_w * exact_x);
            }
            const double got = all[(size_t)t * s.rows + r];
            worst_f16 = std::max(worst_f16, std::fabs(got - f16_sum) / magnitude);
            worst_exact = std::max(worst_exact, std::fabs(got - exact_sum) / magnitude);
        }
        if (worst_f16 > 1e-5) ok = false;

        // A row's bits: the same at every row count, offset into the pass and tile shape.
        std::vector<float> part((size_t)max_tokens * s.rows);
        for (int m : {1, 2, 5, 16, 33, 64, 100, 128, 512, 1000}) {
            for (int first : {0, 7}) {
                for (int tile = 0; tile < TILE_COUNT; tile++) {
                    gemm(tile, dxh + (size_t)first * s.cols, dwh, m, s.rows, s.cols, dout2);
                    CHECK(cudaMemcpy(part.data(), dout2, (size_t)m * s.rows * 4,
                                     cudaMemcpyDeviceToHost));
                    if (memcmp(part.data(), &all[(size_t)first * s.rows],
                               (size_t)m * s.rows * 4) != 0) {
                        printf("%s: rows %d..%d of a pass of %d (tiles of %dx%d) differ from "
                               "the same rows of %d\n",
                               s.name, first, first + m, m, TILES[tile].rows,
                               TILES[tile].weight_rows, max_tokens);
                        ok = false;
                    }
                }
            }
        }

        const int reps = s.rows > 100000 ? 10 : 50;
        const float dequant_us = time_us(dequantize, reps);
        dequant_pass_us += s.per_pass * dequant_us;
        for (int i = 0; i < 3; i++) {
            const int tokens = token_counts[i];
            printf("%-8s %6d %11.1f", s.name, tokens, dequant_us);
            float best = 1e30f;
            for (int tile = 0; tile < TILE_COUNT; tile++) {
                const float us = time_us(
                    [&] { gemm(tile, dxh, dwh, tokens, s.rows, s.cols, dout); }, reps);
                printf(" %10.1f", us);
                pass_us[i][tile] += s.per_pass * us;
                best = std::min(best, us);
            }
            best_pass_us[i] += s.per_pass * best;
            const double tflops = 2.0 * tokens * s.rows * s.cols / (best * 1e-6) / 1e12;
            printf(" %8.1f | %.1e %.1e\n", tflops, worst_f16, worst_exact);
        }
        CHECK(cudaFree(dw));
        CHECK(cudaFree(dwh));
        CHECK(cudaFree(dx));
        CHECK(cudaFree(dxh));
        CHECK(cudaFree(dout));
        CHECK(cudaFree(dout2));
    }
    // The output matrix is applied to logits rows only, which stay on the int8 kernels, so
    // a prompt pass's figures leave it out.
    printf("the layers' matrices: dequantization %.2f ms a pass\n", dequant_pass_us / 1e3);
    for (int i = 0; i < 3; i++) {
        printf("a pass of %d rows, GEMMs:", token_counts[i]);
        for (int tile = 0; tile < TILE_COUNT; tile++) {
            printf(" %.2f ms (%dx%d)", pass_us[i][tile] / 1e3, TILES[tile].rows,
                   TILES[tile].weight_rows);
        }
        const double with_dequant_us = best_pass_us[i] + dequant_pass_us;
        printf(", the best tile per matrix %.2f ms, with the dequantization %.2f ms: at most "
               "%.0f tok/s from the matmuls\n",
               best_pass_us[i] / 1e3, with_dequant_us / 1e3,
               token_counts[i] / (with_dequant_us * 1e-6));
    }
    printf(ok ? "gemm: all checks passed\n" : "gemm: CHECKS FAILED\n");
    return ok ? 0 : 1;
}
