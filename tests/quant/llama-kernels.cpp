// llama.cpp's CPU dot kernels, timed the way crates/quant/examples/quant-bench.rs times ours, so
// that the two print comparable figures on the same machine.
//
// For each type: the row kernel `vec_dot` (what llama.cpp runs for weights it does not repack)
// and, for Q4_K, the 8-row repacked `gemv` it runs on x86 CPUs with AVX2 by default. Shapes and
// timing follow quant-bench: one quantized activation row, every weight row dotted with it, and
// the best time of each 256 KiB chunk of weights over repeated passes.
//
// Build against a llama.cpp build (see build-llama-kernels.sh), then:
//   llama-kernels [--types Q4_K,Q6_K] [--seconds 0.5] [--dram-mib 1024]

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ggml-cpu.h"
#include "ggml.h"

struct block_q4_K;

namespace ggml::cpu::repack {
template <typename BLOC_TYPE, int64_t INTER_SIZE, int64_t NB_COLS, ggml_type PARAM_TYPE>
void gemv(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
}

using Clock = std::chrono::steady_clock;

static const size_t CHUNK_BYTES = 256 << 10;

static std::vector<uint8_t> random_bytes(size_t n) {
    std::vector<uint8_t> bytes(n);
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        bytes[i] = (uint8_t) ((state * 0x2545f4914f6cdd1dull) >> 56);
    }
    return bytes;
}

// Sets the f16 fields at `offsets` of every `stride`-byte block to 0.01.
static void set_scales(std::vector<uint8_t> & bytes, size_t stride, std::vector<size_t> offsets) {
    ggml_fp16_t small = ggml_fp32_to_fp16(0.01f);
    for (size_t block = 0; block + stride <= bytes.size(); block += stride) {
        for (size_t offset : offsets) {
            memcpy(&bytes[block + offset], &small, 2);
        }
    }
}

static std::vector<size_t> f16_fields(ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q4_1:
        case GGML_TYPE_Q5_1:
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q5_K: return {0, 2};
        case GGML_TYPE_Q6_K: return {208};
        default: return {0};
    }
}

// Times `pass_chunk(first_row, rows)` over chunks of rows; returns seconds for one pass.
template <typename F>
static double best_pass(size_t rows, size_t row_bytes, double seconds, F pass_chunk) {
    size_t chunk_rows = CHUNK_BYTES / row_bytes;
    if (chunk_rows == 0) {
        chunk_rows = 1;
    }
    chunk_rows = (chunk_rows + 7) / 8 * 8;  // whole groups of 8 for the repacked kernel
    std::vector<double> best;
    for (size_t first = 0; first < rows; first += chunk_rows) {
        best.push_back(1e30);
    }
    auto start = Clock::now();
    for (int pass = 0; pass < 3 || std::chrono::duration<double>(Clock::now() - start).count() < seconds; pass++) {
        size_t chunk = 0;
        for (size_t first = 0; first < rows; first += chunk_rows, chunk++) {
            size_t count = rows - first < chunk_rows ? rows - first : chunk_rows;
            auto t = Clock::now();
            pass_chunk(first, count);
            double elapsed = std::chrono::duration<double>(Clock::now() - t).count();
            if (elapsed < best[chunk]) {
                best[chunk] = elapsed;
            }
        }
    }
    double total = 0;
    for (double b : best) {
        total += b;
    }
    return total;
}

static void run(ggml_type type, const char * shape, size_t rows, size_t n, double seconds) {
    const ggml_type_traits_cpu * traits = ggml_get_type_traits_cpu(type);
    const ggml_type_traits * base = ggml_get_type_traits(type);
    size_t row_bytes = ggml_row_size(type, n);
    std::vector<uint8_t> weights = random_bytes(rows * row_bytes);
    set_scales(weights, base->type_size, f16_fields(type));

    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) {
        x[i] = (float) ((i * 7919) % 1000) / 500.0f - 1.0f;
    }
    std::vector<uint8_t> activation(ggml_row_size(traits->vec_dot_type, n));
    ggml_get_type_traits_cpu(traits->vec_dot_type)->from_float(x.data(), activation.data(), n);

    std::vector<float> out(rows);
    double t = best_pass(rows, row_bytes, seconds, [&](size_t first, size_t count) {
        for (size_t r = first; r < first + count; r++) {
            traits->vec_dot((int) n, &out[r], 0, &weights[r * row_bytes], 0, activation.data(), 0, 1);
        }
    });
    printf("%-7s %-7s %-9s %6zu %6zu %9.2f %8.2f %12.0f\n", ggml_type_name(type), "vec_dot", shape, rows, n,
           weights.size() / 1048576.0, weights.size() / t / 1e9, rows / t);

    if (type == GGML_TYPE_Q4_K && rows % 8 == 0) {
        // block_q4_Kx8: d[8], dmin[8] (f16), scales[96], qs[1024] per 8 rows of 256.
        std::vector<uint8_t> packed = random_bytes(rows * row_bytes);
        set_scales(packed, 8 * 144, {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30});
        t = best_pass(rows, row_bytes, seconds, [&](size_t first, size_t count) {
            ggml::cpu::repack::gemv<block_q4_K, 8, 8, GGML_TYPE_Q8_K>(
                (int) n, &out[first], 0, &packed[first * row_bytes], activation.data(), 1, (int) count);
        });
        printf("%-7s %-7s %-9s %6zu %6zu %9.2f %8.2f %12.0f\n", ggml_type_name(type), "gemv8x8", shape, rows, n,
               packed.size() / 1048576.0, packed.size() / t / 1e9, rows / t);
    }
}

int main(int argc, char ** argv) {
    std::vector<std::string> names = {"q4_K", "q6_K", "q5_0", "q8_0", "q4_1"};
    double seconds = 0.5;
    size_t dram_mib = 1024;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string flag = argv[i];
        if (flag == "--types") {
            names.clear();
            std::string list = argv[i + 1];
            size_t start = 0;
            while (start <= list.size()) {
                size_t comma = list.find(',', start);
                if (comma == std::string::npos) {
                    comma = list.size();
                }
                names.push_back(list.substr(start, comma - start));
                start = comma + 1;
            }
        } else if (flag == "--seconds") {
            seconds = atof(argv[i + 1]);
        } else if (flag == "--dram-mib") {
            dram_mib = (size_t) atol(argv[i + 1]);
        } else {
            fprintf(stderr, "unknown flag %s\n", flag.c_str());
            return 2;
        }
    }
    ggml_cpu_init();
    printf("%-7s %-7s %-9s %6s %6s %9s %8s %12s\n", "type", "kernel", "shape", "rows", "n", "MiB", "GB/s", "rows/s");
    for (const std::string & name : names) {
        ggml_type type = GGML_TYPE_COUNT;
        for (int t = 0; t < GGML_TYPE_COUNT; t++) {
            const char * type_name = ggml_type_name((ggml_type) t);
            if (type_name && strcasecmp(type_name, name.c_str()) == 0 && ggml_get_type_traits((ggml_type) t)->blck_size > 0) {
                type = (ggml_type) t;
            }
        }
        if (type == GGML_TYPE_COUNT) {
            fprintf(stderr, "unknown type %s\n", name.c_str());
            return 2;
        }
        size_t row_bytes = ggml_row_size(type, 1536);
        run(type, "l2", (512 << 10) / row_bytes / 8 * 8, 1536, seconds);
        run(type, "ffn_up", 8960, 1536, seconds);
        run(type, "ffn_down", 1536, 8960, seconds);
        if (dram_mib > 0) {
            run(type, "dram", (dram_mib << 20) / row_bytes / 8 * 8, 1536, seconds);
        }
    }
    return 0;
}
