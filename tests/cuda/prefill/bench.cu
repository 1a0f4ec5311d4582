// The two routes issue 6 names for a prefill matmul, measured against each other per shape of
// the 1.5B (Q4_K_M: its down projections are Q4_K in half the layers, Q6_K in the other half)
// on random matrices: int8 tiles, the streamed matmul's (kernels/cuda/mmt.cu, `mmt_<format>`,
// which the CUDA host profiles run for every pass of three rows or more), and dequantization
// plus an f16 GEMM (kernels/cuda/gemm.cu, the fastest of its tiles; the backend dequantizes
// before each GEMM, so its time counts). Checks that each dequantized weight of whole rows is
// its exact value rounded once to f16, that both routes compute the same product (their
// largest difference against the largest output), and times each at 128, 512 and 2,048
// activation rows (back-to-back launches, no graph), then sums a 28-layer pass. tests/cuda/mmt
// and tests/cuda/gemm check each route's bits.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o prefill-bench tests/cuda/prefill/bench.cu && ./prefill-bench

#include "../../../kernels/cuda/gemm.cu"
#include "../../../kernels/cuda/mmt.cu"
#include "../../../kernels/cuda/quantize.cu"
#include "../bench.cuh"
#include "../gemm/tiles.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

enum class Format { Q4_K, Q6_K };

struct Shape {
    const char *name;
    Format format;
    int rows, cols, per_pass;
};

static int g_sms = 0;
static float *g_partials = nullptr;
static unsigned *g_counters = nullptr;
constexpr size_t PARTIALS = (size_t)1 << 27, COUNTERS = (size_t)1 << 20;

// The streamed matmul's tiles over `tokens` activation rows, as the backend launches them.
static void streamed(const Shape &s, const uint8_t *w, const QuantizedOut &x, int tokens,
                     float *out) {
    const int row_blocks = (s.rows + MMT_BLOCK_ROWS - 1) / MMT_BLOCK_ROWS;
    // The backend's split: from the matrix's row blocks and the device alone.
    const int ksplit = split_for(row_blocks, s.cols / 256, g_sms);
    const long long grid =
        (long long)row_blocks * ksplit * ((tokens + MMT_TOKENS - 1) / MMT_TOKENS);
    const bool q4 = s.format == Format::Q4_K;
    const unsigned long long row_bytes = (unsigned long long)s.cols / 256 * (q4 ? 144 : 210);
    (q4 ? mmt_q4_k : mmt_q6_k)<<<(unsigned)grid, MMT_WARPS * WARP_SIZE>>>(
        w, s.rows, nullptr, out, nullptr, 0, nullptr, nullptr, nullptr, 0, nullptr, nullptr,
        row_bytes, s.cols, x.hi, x.lo, x.scales, x.sums, tokens, ksplit, g_partials,
        g_counters);
}

int main() {
    CHECK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaMalloc(&g_partials, PARTIALS * 4));
    CHECK(cudaMalloc(&g_counters, COUNTERS * 4));
    CHECK(cudaMemset(g_counters, 0, COUNTERS * 4));

    const Shape shapes[] = {{"q,k,v", Format::Q4_K, 2048, 1536, 28},
                            {"o", Format::Q4_K, 1536, 1536, 28},
                            {"gate,up", Format::Q4_K, 17920, 1536, 28},
                            {"down", Format::Q4_K, 1536, 8960, 14},
                            {"down", Format::Q6_K, 1536, 8960, 14}};
    const int max_tokens = 2048, token_counts[] = {128, 512, 2048};
    double pass_us[3][2] = {};
    std::mt19937 rng(7);
    bool ok = true;
    printf("%-8s %4s %6s | %8s %8s %6s | %s\n", "matrix", "fmt", "tokens", "int8 us", "f16 us",
           "ratio", "routes' difference / largest output");
    for (const Shape &s : shapes) {
        const bool q4 = s.format == Format::Q4_K;
        const size_t row_bytes = (size_t)s.cols / 256 * (q4 ? 144 : 210);
        const size_t bytes = row_bytes * s.rows;
        const std::vector<uint8_t> w = q4 ? random_q4_k(bytes, rng) : random_q6_k(bytes, rng);
        const std::vector<float> x = random_activations((size_t)max_tokens * s.cols, rng);
        const size_t values = x.size();

        uint8_t *dw;
        float *dx, *dint8, *dgemm;
        __half *dwh, *dxh;
        QuantizedOut q;
        CHECK(cudaMalloc(&dw, bytes + 32));
        CHECK(cudaMemcpy(dw, w.data(), bytes, cudaMemcpyHostToDevice));
        CHECK(cudaMalloc(&dwh, (size_t)s.rows * s.cols * 2));
        CHECK(cudaMalloc(&dx, values * 4));
        CHECK(cudaMemcpy(dx, x.data(), values * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMalloc(&dxh, values * 2));
        CHECK(cudaMalloc(&q.hi, values));
        CHECK(cudaMalloc(&q.lo, values));
        CHECK(cudaMalloc(&q.scales, values / 32 * 8));
        CHECK(cudaMalloc(&q.sums, values / 16 * 4));
        const size_t out_bytes = (size_t)max_tokens * s.rows * 4;
        CHECK(cudaMalloc(&dint8, out_bytes));
        CHECK(cudaMalloc(&dgemm, out_bytes));
        const long long elements = (long long)s.rows * s.cols;
        auto dequantize = [&] {
            (q4 ? dequantize_f16_q4_k : dequantize_f16_q6_k)<<<(elements / 8 + 255) / 256, 256>>>(
                dw, row_bytes, s.rows, s.cols, dwh);
        };
        dequantize();
        activations_to_f16<<<(values / 2 + 255) / 256, 256>>>(dx, (long long)values, dxh);
        quantize_q8<<<(values / 32 + 7) / 8, 256>>>(dx, (long long)(values / 32), q);
        CHECK(cudaDeviceSynchronize());
        std::vector<uint16_t> wh((size_t)elements);
        CHECK(cudaMemcpy(wh.data(), dwh, wh.size() * 2, cudaMemcpyDeviceToHost));
        ok = dequantized_weights_ok(s.name, w, q4 ? 144 : 210, s.rows, s.cols, wh,
                                    q4 ? q4_k_at : q6_k_at) &&
             ok;

        auto gemm_best = [&](int tokens, float *out, float *us) {
            float best = 1e30f;
            for (int tile = 0; tile < TILE_COUNT; tile++) {
                auto launch = [&] { gemm(tile, dxh, dwh, tokens, s.rows, s.cols, out); };
                if (us) best = std::min(best, time_us(launch, 20));
                else launch();
            }
            if (us) *us = best;
        };

        streamed(s, dw, q, max_tokens, dint8);
        gemm_best(max_tokens, dgemm, nullptr);
        CHECK(cudaDeviceSynchronize());
        std::vector<float> int8((size_t)max_tokens * s.rows), f16(int8.size());
        CHECK(cudaMemcpy(int8.data(), dint8, out_bytes, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(f16.data(), dgemm, out_bytes, cudaMemcpyDeviceToHost));
        double largest = 0, difference = 0;
        for (size_t i = 0; i < int8.size(); i++) {
            largest = std::max(largest, (double)std::fabs(f16[i]));
            difference = std::max(difference, (double)std::fabs(int8[i] - f16[i]));
        }
        if (!(difference <= 0.05 * largest)) {
            printf("%s: the routes differ by %.3g, the largest output %.3g\n", s.name, difference,
                   largest);
            ok = false;
        }

        const float dequant_us = time_us(dequantize, 20);
        for (int i = 0; i < 3; i++) {
            const int tokens = token_counts[i];
            const float int8_us = time_us([&] { streamed(s, dw, q, tokens, dint8); }, 20);
            float gemm_us;
            gemm_best(tokens, dgemm, &gemm_us);
            gemm_us += dequant_us;
            pass_us[i][0] += s.per_pass * int8_us;
            pass_us[i][1] += s.per_pass * gemm_us;
            printf("%-8s %4s %6d | %8.1f %8.1f %6.2f | %.1e\n", s.name, q4 ? "q4_k" : "q6_k",
                   tokens, int8_us, gemm_us, int8_us / gemm_us, difference / largest);
        }
        for (void *p : {(void *)dw, (void *)dx, (void *)dint8, (void *)dgemm,
                        (void *)dwh, (void *)dxh, (void *)q.hi, (void *)q.lo, (void *)q.scales,
                        (void *)q.sums}) {
            CHECK(cudaFree(p));
        }
    }
    for (int i = 0; i < 3; i++) {
        printf("a pass of %d rows, the 28 layers' matmuls: int8 tiles %.2f ms, dequantization "
               "and f16 GEMM %.2f ms (%.2fx)\n",
               token_counts[i], pass_us[i][0] / 1e3, pass_us[i][1] / 1e3,
               pass_us[i][0] / pass_us[i][1]);
    }
    printf(ok ? "prefill: all checks passed\n" : "prefill: CHECKS FAILED\n");
    return ok ? 0 : 1;
}
