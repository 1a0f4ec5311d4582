// The candidate matmuls of kernels.cuh (not used by the backend) against the matvec and mmq
// kernels the backend runs today, on random Q4_K matrices of the 1.5B's shapes: each one's
// error against an f64 product of the same quantized operands, whether a row's result depends
// on the rows beside it (bitwise), whether mmv256 gives mmt4's bits, and the time per call at
// 1 to 16 activation rows (back-to-back launches, no graph). The README's "Tensor cores for
// every pass" gives the H200's figures.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o mmt-bench tests/cuda/mmt/bench.cu && ./mmt-bench
//   (-DMMT_WARPS=8 and -DMMT_STAGES=3 for the other block shapes measured there)
//   MMT_PROFILE=1 ncu --kernel-name regex:mmt4 ./mmt-bench    (one launch of each, gate and up)

#include "../../../kernels/cuda/mmq.cu"
#include "kernels.cuh"
#include "../../../kernels/cuda/mmv.cu"
#include "../../../kernels/cuda/quantize.cu"
#include "../bench.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

struct Shape {
    const char *name;
    int rows, cols;
};

struct Quantized {
    signed char *hi, *lo;
    float2 *scales;
    float *sums;
};

static int g_sms = 0;

static float *g_partials = nullptr;
static unsigned *g_counters = nullptr;

enum class Kernel { Mmt2, Mmt4, Mmt5, Mmv256 };

// A candidate, and how many blocks per SM its super-block split aims at (mmv256: that of the
// mmt4 with the same target, whose bits it gives; mmt5: 0, as many as fit).
struct Variant {
    const char *name;
    Kernel kernel;
    int per_sm;
};
static const Variant VARIANTS[] = {{"mmt2", Kernel::Mmt2, 1},  {"mmt4", Kernel::Mmt4, 1},
                                   {"mmt4/8", Kernel::Mmt4, 8}, {"mmt5", Kernel::Mmt5, 0},
                                   {"mmv256", Kernel::Mmv256, 1}};
// The activations quantized per 256 too (mmt4, mmt5, mmv256), and where those quantized per 32
// start, from which a row's offset into both is taken.
static signed char *g_hi256, *g_lo256;
static float2 *g_scales256;
static int2 *g_bsums256;
static const signed char *g_hi = nullptr;

static void launch_mmt(const Variant &v, const uint8_t *w, const Shape &s, const Quantized &x,
                       int tokens, float *out) {
    const unsigned long long row_bytes = s.cols / 256 * 144;
    const int blocks = s.cols / 256, row_blocks = (s.rows + MMT_BLOCK_ROWS - 1) / MMT_BLOCK_ROWS;
    // mmv256 takes the split of the mmt4 with the same target, whose bits it gives.
    const int ksplit = split_for(row_blocks, blocks, v.per_sm * g_sms);
    const int tiles = (tokens + MMT_TOKENS - 1) / MMT_TOKENS;
    // The same row's offset into the activations quantized per 256.
    const size_t off = x.hi - g_hi;
    switch (v.kernel) {
    case Kernel::Mmt2:
        mmt_q4_k<<<row_blocks * ksplit * tiles, MMT_WARPS * 32>>>(
            w, s.rows, nullptr, out, nullptr, 0, nullptr, nullptr, nullptr, 0, nullptr, nullptr,
            row_bytes, s.cols, x.hi, x.lo, x.scales, x.sums, tokens, ksplit, g_partials,
            g_counters);
        break;
    case Kernel::Mmt4:
        mmt4_q4_k<<<row_blocks * ksplit * tiles, MMT_WARPS * 32>>>(
            w, s.rows, row_bytes, s.cols, ksplit, g_hi256 + off, g_lo256 + off,
            g_scales256 + off / 256, g_bsums256 + off / 16, tokens, out, g_partials, g_counters);
        break;
    case Kernel::Mmt5: {
        static int per_sm = 0;
        if (per_sm == 0) {
            CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mmt5_q4_k,
                                                                MMT_WARPS * 32, MMT4_SMEM));
        }
        const long long steps = (long long)row_blocks * blocks;
        const long long grid = std::min<long long>(steps, (long long)per_sm * g_sms);
        mmt5_q4_k<<<dim3((unsigned)grid, tiles), MMT_WARPS * 32, MMT4_SMEM>>>(
            w, s.rows, row_bytes, s.cols, g_hi256 + off, g_lo256 + off,
            g_scales256 + off / 256, g_bsums256 + off / 16, tokens, out, g_partials, g_counters);
        break;
    }
    case Kernel::Mmv256: {
        const int pair = ksplit == 1 && blocks % 4 == 2 ? 2 : 1;
        const int rows_per_block = ksplit == 1 ? 4 * pair : std::max(1, 8 / ksplit);
        const int warps_per_block = ksplit == 1 ? 4 : rows_per_block * ksplit;
        mmv256_q4_k<<<(s.rows + rows_per_block - 1) / rows_per_block, warps_per_block * 32>>>(
            w, s.rows, row_bytes, s.cols, ksplit, pair, g_hi256 + off, g_lo256 + off,
            g_scales256 + off / 256, g_bsums256 + off / 16, tokens, out);
        break;
    }
    }
}

// What the backend launches today for `tokens` rows (matvec_loop_rows 16, mmq_rows 6).
static const char *launch_current(const uint8_t *w, const Shape &s, const Quantized &x,
                                  int tokens, float *out) {
    const unsigned long long row_bytes = s.cols / 256 * 144;
    const int spans = s.cols / 32;
    if (tokens >= 6) {
        const int tile = tokens <= 8 ? 8 : 16;
        int split_spans = 0;
        if (spans > 64) {
            const int pieces = (spans + 63) / 64;
            split_spans = (spans + pieces - 1) / pieces;
        }
        const int grid = (s.rows + 15) / 16 * ((tokens + tile - 1) / tile);
        if (tile == 8) {
            mmq8_q4_k<<<grid, 256>>>(w, s.rows, nullptr, out, row_bytes, s.cols, split_spans,
                                     x.hi, x.lo, x.scales, x.sums, tokens);
        } else {
            mmq16_q4_k<<<grid, 256>>>(w, s.rows, nullptr, out, row_bytes, s.cols, split_spans,
                                      x.hi, x.lo, x.scales, x.sums, tokens);
        }
        return "mmq";
    }
    if (spans > 64) {
        const int pieces = (spans + 63) / 64, piece_spans = (spans + pieces - 1) / pieces;
        mmv1s_q4_k<<<s.rows, pieces * 32>>>(w, s.rows, nullptr, out, row_bytes, s.cols,
                                            piece_spans, x.hi, x.lo, x.scales, x.sums, tokens);
        return "mmv1s";
    }
    if (spans % 32 == 16 && s.rows >= 8192) {
        mmv1p_q4_k<<<(s.rows + 7) / 8, 128>>>(w, s.rows, nullptr, out, nullptr, 0, nullptr,
                                              nullptr, nullptr, 0, nullptr, nullptr, row_bytes,
                                              s.cols, x.hi, x.lo, x.scales, x.sums, tokens);
        return "mmv1p";
    }
    mmv1_q4_k<<<(s.rows + 3) / 4, 128>>>(w, s.rows, nullptr, out, nullptr, 0, nullptr, nullptr,
                                         nullptr, 0, nullptr, nullptr, row_bytes, s.cols, x.hi,
                                         x.lo, x.scales, x.sums, tokens);
    return "mmv1";
}

int main() {
    CHECK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaFuncSetAttribute(mmt5_q4_k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               MMT4_SMEM));
    CHECK(cudaMalloc(&g_partials, (size_t)16 * 16 * 151936 * 4));
    CHECK(cudaMalloc(&g_counters, 65536 * 4));
    CHECK(cudaMemset(g_counters, 0, 65536 * 4));
    const Shape shapes[] = {{"q,k,v", 2048, 1536},
                            {"o", 1536, 1536},
                            {"gate,up", 17920, 1536},
                            {"down", 1536, 8960},
                            {"output", 151936, 1536}};
    const int max_tokens = 16;
    std::mt19937 rng(7);
    bool ok = true;
    printf("%-8s %6s | %-6s %8s", "matrix", "tokens", "now", "us");
    for (const Variant &v : VARIANTS) printf(" | %8s", v.name);
    printf(" | worst error: now, each variant\n");
    for (const Shape &s : shapes) {
        const size_t row_bytes = s.cols / 256 * 144, bytes = row_bytes * s.rows;
        const std::vector<uint8_t> w = random_q4_k(bytes, rng);
        const std::vector<float> x = random_activations((size_t)max_tokens * s.cols, rng);

        uint8_t *dw;
        float *dx, *dout, *dout2;
        Quantized q;
        CHECK(cudaMalloc(&dw, bytes));
        CHECK(cudaMemcpy(dw, w.data(), bytes, cudaMemcpyHostToDevice));
        CHECK(cudaMalloc(&dx, x.size() * 4));
        CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMalloc(&q.hi, x.size()));
        CHECK(cudaMalloc(&q.lo, x.size()));
        CHECK(cudaMalloc(&q.scales, x.size() / 32 * 8));
        CHECK(cudaMalloc(&q.sums, x.size() / 16 * 4));
        const long long groups = x.size() / 32;
        quantize_q8<<<(groups + 7) / 8, 256>>>(dx, groups, {q.hi, q.lo, q.scales, q.sums});
        g_hi = q.hi;
        CHECK(cudaMalloc(&g_hi256, x.size()));
        CHECK(cudaMalloc(&g_lo256, x.size()));
        CHECK(cudaMalloc(&g_scales256, x.size() / 256 * 8));
        CHECK(cudaMalloc(&g_bsums256, x.size() / 16 * 8));
        quantize_q8_256<<<(x.size() / 256 + 7) / 8, 256>>>(dx, x.size() / 256, g_hi256, g_lo256,
                                                          g_scales256, g_bsums256);
        std::vector<signed char> hi256(x.size()), lo256(x.size());
        std::vector<float2> sc256(x.size() / 256);
        CHECK(cudaMemcpy(hi256.data(), g_hi256, x.size(), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(lo256.data(), g_lo256, x.size(), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(sc256.data(), g_scales256, x.size() / 256 * 8, cudaMemcpyDeviceToHost));
        CHECK(cudaMalloc(&dout, (size_t)max_tokens * s.rows * 4));
        CHECK(cudaMalloc(&dout2, (size_t)max_tokens * s.rows * 4));
        std::vector<signed char> hi(x.size()), lo(x.size());
        std::vector<float2> sc(groups);
        CHECK(cudaMemcpy(hi.data(), q.hi, x.size(), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(lo.data(), q.lo, x.size(), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(sc.data(), q.scales, groups * 8, cudaMemcpyDeviceToHost));
        std::vector<double> xq(x.size());
        for (size_t i = 0; i < x.size(); i++) {
            xq[i] = (double)sc[i / 32].x * hi[i] + (double)sc[i / 32].y * lo[i];
        }
        // The f64 reference for a sample of rows, and each row's sum of |w x| as its scale.
        const int sample = 64;
        std::vector<double> ref((size_t)max_tokens * sample), mag((size_t)max_tokens * sample);
        std::vector<double> ref_x((size_t)max_tokens * sample), ref256((size_t)max_tokens * sample);
        std::vector<double> wrow(s.cols);
        for (int k = 0; k < sample; k++) {
            const int r = (int)((long long)k * (s.rows - 1) / (sample - 1));
            for (int c = 0; c < s.cols; c++) {
                wrow[c] = q4_k_at(&w[r * row_bytes + c / 256 * 144], c % 256);
            }
            for (int t = 0; t < max_tokens; t++) {
                double sum = 0, m = 0, sum_x = 0, sum256 = 0;
                for (int c = 0; c < s.cols; c++) {
                    const size_t i = (size_t)t * s.cols + c;
                    sum256 += wrow[c] * ((double)sc256[i / 256].x * hi256[i] +
                                         (double)sc256[i / 256].y * lo256[i]);
                    sum += wrow[c] * xq[(size_t)t * s.cols + c];
                    sum_x += wrow[c] * (double)x[(size_t)t * s.cols + c];
                    m += std::fabs(wrow[c] * xq[(size_t)t * s.cols + c]);
                }
                ref[t * sample + k] = sum;
                ref_x[t * sample + k] = sum_x;
                ref256[t * sample + k] = sum256;
                mag[t * sample + k] = m;
            }
        }
        auto error = [&](const float *dev, int tokens, int which) {
            std::vector<float> got((size_t)tokens * s.rows);
            CHECK(cudaMemcpy(got.data(), dev, got.size() * 4, cudaMemcpyDeviceToHost));
            double worst = 0;
            for (int t = 0; t < tokens; t++) {
                for (int k = 0; k < sample; k++) {
                    const int r = (int)((long long)k * (s.rows - 1) / (sample - 1));
                    const double e = std::fabs(got[(size_t)t * s.rows + r] -
                                               (which == 1 ? ref_x : which == 2 ? ref256 : ref)[t * sample + k]) /
                                     mag[t * sample + k];
                    worst = std::max(worst, e);
                }
            }
            return worst;
        };
        if (getenv("MMT_PROFILE")) {
            // One launch of each, for ncu: gate and up only.
            if (s.rows != 17920) continue;
            for (int tokens : {1, 8}) {
                launch_current(dw, s, q, tokens, dout);
                launch_mmt(VARIANTS[1], dw, s, q, tokens, dout2);
            }
            CHECK(cudaDeviceSynchronize());
            continue;
        }
        // Row t alone against row t among 16: the same bits.
        for (const Variant &v : VARIANTS) {
        launch_mmt(v, dw, s, q, max_tokens, dout);
        std::vector<float> all((size_t)max_tokens * s.rows), alone(s.rows);
        CHECK(cudaMemcpy(all.data(), dout, all.size() * 4, cudaMemcpyDeviceToHost));
        for (int t = 0; t < max_tokens; t++) {
            const Quantized qt = {q.hi + (size_t)t * s.cols, q.lo + (size_t)t * s.cols,
                                  q.scales + (size_t)t * s.cols / 32,
                                  q.sums + (size_t)t * s.cols / 16};
            launch_mmt(v, dw, s, qt, 1, dout2);
            CHECK(cudaMemcpy(alone.data(), dout2, s.rows * 4, cudaMemcpyDeviceToHost));
            if (memcmp(alone.data(), &all[(size_t)t * s.rows], s.rows * 4) != 0) {
                printf("%s %s: row %d alone differs from row %d among %d\n", v.name, s.name,
                       t, t, max_tokens);
                ok = false;
            }
        }
        }
        for (int tokens : {1, 2, 3, 4, 6, 8, 16}) {
            const char *now = launch_current(dw, s, q, tokens, dout);
            CHECK(cudaDeviceSynchronize());
            const double err_now = error(dout, tokens, 0), err_now_x = error(dout, tokens, 1);
            const int reps = s.rows > 100000 ? 50 : 200;
            const float us_now = time_us([&] { launch_current(dw, s, q, tokens, dout); }, reps);
            printf("%-8s %6d | %-6s %8.2f", s.name, tokens, now, us_now);
            char errs[256] = "";
            for (const Variant &v : VARIANTS) {
                launch_mmt(v, dw, s, q, tokens, dout2);
                CHECK(cudaDeviceSynchronize());
                const double err = error(dout2, tokens, v.kernel == Kernel::Mmt2 ? 0 : 2);
                if (v.kernel == Kernel::Mmv256) {
                    // The same bits as mmt4 with the same split.
                    const Variant &twin = *std::find_if(
                        std::begin(VARIANTS), std::end(VARIANTS), [&](const Variant &u) {
                            return u.kernel == Kernel::Mmt4 && u.per_sm == v.per_sm;
                        });
                    std::vector<float> mine((size_t)tokens * s.rows), theirs(mine.size());
                    CHECK(cudaMemcpy(mine.data(), dout2, mine.size() * 4, cudaMemcpyDeviceToHost));
                    launch_mmt(twin, dw, s, q, tokens, dout2);
                    CHECK(cudaMemcpy(theirs.data(), dout2, theirs.size() * 4,
                                     cudaMemcpyDeviceToHost));
                    if (memcmp(mine.data(), theirs.data(), mine.size() * 4) != 0) {
                        printf("%s %s %d tokens: not the bits of %s\n", v.name, s.name, tokens,
                               twin.name);
                        ok = false;
                    }
                }
                snprintf(errs + strlen(errs), sizeof errs - strlen(errs), " %.1e/x %.1e", err,
                         error(dout2, tokens, 1));
                if (err > 1e-5) ok = false;
                const float us = time_us([&] { launch_mmt(v, dw, s, q, tokens, dout2); }, reps);
                printf(" | %8.2f", us);
            }
            printf(" | %.1e (%.1e to exact x)%s\n", err_now, err_now_x, errs);
        }
        CHECK(cudaFree(dw));
        CHECK(cudaFree(dx));
        CHECK(cudaFree(dout));
        CHECK(cudaFree(dout2));
        CHECK(cudaFree(q.hi));
        CHECK(cudaFree(q.lo));
        CHECK(cudaFree(q.scales));
        CHECK(cudaFree(q.sums));
    }
    printf(ok ? "mmt: all checks passed\n" : "mmt: CHECKS FAILED\n");
    return ok ? 0 : 1;
}
