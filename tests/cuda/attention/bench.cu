// Prompt rows' attention, the two kernels the CUDA backend has for it, on a random paged KV
// cache in the shapes of the test models: attention.cu's (a block per token and head, what
// every row takes by default) and prompt_attention.cu's (tiles of K and V shared by 64 rows
// on the tensor cores, what prompt rows take with `prompt_attention`). For each shape it
// - compares the two (largest difference against the largest output: f16 rounding of q and of
//   the weights);
// - checks that prompt_attention gives every row the same bits whatever pass it is in: the
//   whole prompt in one pass, the prompt cut into passes of random lengths, and passes holding
//   rows of two sequences whose boundary falls inside a warp's rows;
// - times both over a whole prompt (back-to-back launches, no graph) and sums 28 layers.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o attention-bench tests/cuda/attention/bench.cu && ./attention-bench

#include "../../../kernels/cuda/attention.cu"
#include "../../../kernels/cuda/prompt_attention.cu"
#include "../bench.cuh"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

constexpr int BLOCK_TOKENS = 16, WARPS = 16, LAYERS = 28;

struct Shape {
    const char *name;
    int heads, kv_heads, head_dim, tokens;
};

// A pass's batch description, on the device.
struct Pass {
    int rows;
    unsigned *positions, *table_offsets;
    float *q, *out;
};

template <typename T> static T *upload(const std::vector<T> &host) {
    T *device;
    CHECK(cudaMalloc(&device, host.size() * sizeof(T)));
    CHECK(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    return device;
}

template <typename T> static std::vector<T> download(const T *device, size_t n) {
    std::vector<T> host(n);
    CHECK(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
}

struct Cache {
    __half *k, *v;
    unsigned *block_ids;
};

static void prompt_attention(const Shape &s, const Cache &c, const Pass &p, float scale) {
    const int blocks = (p.rows + PROMPT_ATTENTION_ROWS - 1) / PROMPT_ATTENTION_ROWS * s.heads;
    const QuantizedOut none{};
    auto kernel = s.head_dim == 64 ? prompt_attention_64 : prompt_attention_128;
    kernel<<<blocks, PROMPT_ATTENTION_WARPS * WARP_SIZE>>>(
        p.q, c.k, c.v, p.positions, p.table_offsets, c.block_ids, BLOCK_TOKENS, p.rows, s.heads,
        s.kv_heads, scale, p.out, none);
}

// attention.cu's kernel as the backend launches it for a pass of many tokens: one block per
// (token, head) taking every range, with the profiles' 16 warps.
static void token_attention(const Shape &s, const Cache &c, const Pass &p, float scale) {
    const QuantizedOut none{};
    auto kernel = s.head_dim == 64 ? attention_64 : attention_128;
    kernel<<<p.rows * s.heads, WARPS * WARP_SIZE>>>(
        0, p.q, c.k, c.v, p.positions, p.table_offsets, c.block_ids, BLOCK_TOKENS, s.heads,
        s.kv_heads, scale, WARPS, 1, nullptr, nullptr, p.out, none, nullptr, nullptr, nullptr,
        nullptr, 0, 0);
}

// Whether rows [0, rows) of `got` (q_width values each) have the bits of `want`'s rows from
// `from`.
static bool same_bits(const std::vector<float> &got, const std::vector<float> &want, int from,
                      int rows, size_t q_width) {
    return memcmp(got.data(), want.data() + (size_t)from * q_width,
                  (size_t)rows * q_width * sizeof(float)) == 0;
}

// Runs `shape`'s checks and timings; false if a check failed.
static bool run(const Shape &s, std::mt19937 &rng) {
    const size_t q_width = (size_t)s.heads * s.head_dim, kv_width = (size_t)s.kv_heads * s.head_dim;
    const float scale = 1.0f / std::sqrt((float)s.head_dim);
    // Two sequences of s.tokens positions over a shuffled pool with spare blocks.
    const int table = (s.tokens + BLOCK_TOKENS - 1) / BLOCK_TOKENS, pool = 2 * table + 5;
    std::vector<unsigned> ids(pool);
    std::iota(ids.begin(), ids.end(), 0u);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(2 * table);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<__half> k((size_t)pool * BLOCK_TOKENS * kv_width), v(k.size());
    for (auto &x : k) x = __float2half(normal(rng));
    for (auto &x : v) x = __float2half(normal(rng));
    // q of both sequences' rows, some heads peaked (a few positions take most of the weight).
    std::vector<float> q(2 * (size_t)s.tokens * q_width);
    for (size_t i = 0; i < q.size(); i++) {
        q[i] = normal(rng) * ((i / s.head_dim) % 3 == 0 ? 4.0f : 1.0f);
    }
    const Cache cache{upload(k), upload(v), upload(ids)};
    float *q_device = upload(q);
    std::vector<unsigned> positions(2 * s.tokens), offsets(2 * s.tokens);
    for (int i = 0; i < 2 * s.tokens; i++) {
        positions[i] = i % s.tokens;
        offsets[i] = i < s.tokens ? 0 : table;
    }
    unsigned *positions_device = upload(positions), *offsets_device = upload(offsets);
    float *out;
    CHECK(cudaMalloc(&out, 2 * (size_t)s.tokens * q_width * sizeof(float)));
    const auto pass_of = [&](int first, int rows) {
        return Pass{rows, positions_device + first, offsets_device + first,
                    q_device + first * q_width, out + first * q_width};
    };
    const Pass a = pass_of(0, s.tokens), b = pass_of(s.tokens, s.tokens);

    token_attention(s, cache, a, scale);
    const std::vector<float> reference = download(out, s.tokens * q_width);
    prompt_attention(s, cache, a, scale);
    prompt_attention(s, cache, b, scale);
    const std::vector<float> whole = download(out, 2 * s.tokens * q_width);
    double largest = 0, difference = 0;
    for (size_t i = 0; i < reference.size(); i++) {
        largest = std::max(largest, (double)std::fabs(reference[i]));
        difference = std::max(difference, (double)std::fabs(reference[i] - whole[i]));
    }
    bool ok = std::isfinite(difference) && difference <= 1e-2 * largest;

    // The prompt in passes of random lengths.
    std::uniform_int_distribution<int> length(1, 200);
    bool chunks_same = true;
    int passes = 0;
    for (int first = 0; first < s.tokens; passes++) {
        const int rows = std::min(length(rng), s.tokens - first);
        CHECK(cudaMemset(out, 0xFF, s.tokens * q_width * sizeof(float)));
        prompt_attention(s, cache, pass_of(first, rows), scale);
        chunks_same &= same_bits(download(out + first * q_width, rows * q_width), whole, first,
                                 rows, q_width);
        first += rows;
    }
    // Passes of rows of both sequences: 37 of the first from position p, then 50 of the
    // second from position p', whose boundary falls inside the third warp's rows.
    bool mixed_same = true;
    for (int round = 0; round < 8; round++) {
        const int rows_a = 37, rows_b = 50;
        const int from_a = std::uniform_int_distribution<int>(0, s.tokens - rows_a)(rng);
        const int from_b = std::uniform_int_distribution<int>(0, s.tokens - rows_b)(rng);
        std::vector<float> mixed_q((size_t)(rows_a + rows_b) * q_width);
        std::copy_n(q.begin() + from_a * q_width, rows_a * q_width, mixed_q.begin());
        std::copy_n(q.begin() + (s.tokens + from_b) * q_width, rows_b * q_width,
                    mixed_q.begin() + rows_a * q_width);
        std::vector<unsigned> mixed_positions, mixed_offsets;
        for (int i = 0; i < rows_a; i++) {
            mixed_positions.push_back(from_a + i);
            mixed_offsets.push_back(0);
        }
        for (int i = 0; i < rows_b; i++) {
            mixed_positions.push_back(from_b + i);
            mixed_offsets.push_back(table);
        }
        float *mixed_q_device = upload(mixed_q), *mixed_out;
        unsigned *mp = upload(mixed_positions), *mo = upload(mixed_offsets);
        CHECK(cudaMalloc(&mixed_out, mixed_q.size() * sizeof(float)));
        prompt_attention(s, cache, Pass{rows_a + rows_b, mp, mo, mixed_q_device, mixed_out},
                         scale);
        const std::vector<float> got = download(mixed_out, mixed_q.size());
        const std::vector<float> got_b(got.begin() + rows_a * q_width, got.end());
        mixed_same &= same_bits(got, whole, from_a, rows_a, q_width) &&
                      same_bits(got_b, whole, s.tokens + from_b, rows_b, q_width);
        CHECK(cudaFree(mixed_q_device));
        CHECK(cudaFree(mixed_out));
        CHECK(cudaFree(mp));
        CHECK(cudaFree(mo));
    }
    ok &= chunks_same && mixed_same;

    const float token_us = time_us([&] { token_attention(s, cache, a, scale); }, 20);
    const float prompt_us = time_us([&] { prompt_attention(s, cache, a, scale); }, 20);
    printf("%-22s %6d %12.1f %12.1f %6.2fx %10.2f %10.2f %10.2e %6s %6s (%d passes)\n", s.name,
           s.tokens, token_us, prompt_us, token_us / prompt_us, LAYERS * token_us / 1000,
           LAYERS * prompt_us / 1000, difference / largest, chunks_same ? "same" : "DIFFER",
           mixed_same ? "same" : "DIFFER", passes);
    for (void *p : {(void *)cache.k, (void *)cache.v, (void *)cache.block_ids, (void *)q_device,
                    (void *)positions_device, (void *)offsets_device, (void *)out}) {
        CHECK(cudaFree(p));
    }
    return ok;
}

int main() {
    std::mt19937 rng(7);
    const Shape shapes[] = {
        {"1.5B (12/2 x 128)", 12, 2, 128, 512},  {"1.5B (12/2 x 128)", 12, 2, 128, 2048},
        {"0.5B (14/2 x 64)", 14, 2, 64, 512},    {"0.5B (14/2 x 64)", 14, 2, 64, 2048},
        {"SmolLM2 (9/3 x 64)", 9, 3, 64, 512},
    };
    printf("%-22s %6s %12s %12s %7s %10s %10s %10s %6s %6s\n", "shape", "rows", "token us",
           "prompt us", "ratio", "28L token", "28L prompt", "max diff", "chunks", "mixed");
    bool ok = true;
    for (const Shape &s : shapes) ok &= run(s, rng);
    printf(ok ? "all checks passed\n" : "A CHECK FAILED\n");
    return ok ? 0 : 1;
}
