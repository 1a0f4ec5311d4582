// kernels/cuda/prompt_attention.cu on the host emulation of warp.h: for heads of 64 and 128
// dimensions (4 query heads sharing 2 KV heads) and three sequences of 150, 90 and 7 positions
// over a shuffled block pool, each sequence's rows in one pass are compared with a float64
// reference of causal attention (within f16 rounding of the weights), and passes
// mixing the sequences, round-robin (a segment a row) and 37 positions of each at a time (the
// sequence changing inside a warp's 16 rows), must give each row the bits of the one pass.
// Run by tests/cuda/emulate/run.

#include "prompt_attention.cu"

#include <cstdio>
#include <numeric>
#include <random>
#include <utility>

constexpr int BLOCK_TOKENS = 16, HEADS = 4, KV_HEADS = 2;

struct Cache {
    int head_dim;
    std::vector<unsigned> block_ids, table_starts;
    std::vector<__half> k, v;
    // Each sequence's q rows.
    std::vector<std::vector<float>> q;

    size_t slot(int sequence, int position) const {
        return (size_t)block_ids[table_starts[sequence] + position / BLOCK_TOKENS] *
                   BLOCK_TOKENS +
               position % BLOCK_TOKENS;
    }
};

// One pass over the rows (sequence, position), as the backend launches it; their outputs.
static std::vector<float> pass(const Cache &c, const std::vector<std::pair<int, int>> &rows) {
    const size_t q_width = (size_t)HEADS * c.head_dim;
    std::vector<float> q(rows.size() * q_width), out(q.size(), NAN);
    std::vector<unsigned> positions, table_offsets;
    for (size_t r = 0; r < rows.size(); r++) {
        const auto [sequence, position] = rows[r];
        std::copy_n(c.q[sequence].begin() + position * q_width, q_width, q.begin() + r * q_width);
        positions.push_back(position);
        table_offsets.push_back(c.table_starts[sequence]);
    }
    const int blocks = (rows.size() + PROMPT_ATTENTION_ROWS - 1) / PROMPT_ATTENTION_ROWS * HEADS;
    const auto kernel = c.head_dim == 64 ? prompt_attention_64 : prompt_attention_128;
    launch(blocks, PROMPT_ATTENTION_WARPS * WARP_SIZE, [&] {
        kernel(q.data(), c.k.data(), c.v.data(), positions.data(), table_offsets.data(),
               c.block_ids.data(), BLOCK_TOKENS, (int)rows.size(), HEADS, KV_HEADS,
               1.0f / std::sqrt((float)c.head_dim), out.data(), QuantizedOut{});
    });
    return out;
}

int main() {
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const std::vector<int> lengths = {150, 90, 7};
    bool ok = true;
    for (int head_dim : {64, 128}) {
        Cache c{head_dim};
        const size_t q_width = (size_t)HEADS * head_dim, kv_width = (size_t)KV_HEADS * head_dim;
        int blocks = 0;
        for (int length : lengths) blocks += (length + BLOCK_TOKENS - 1) / BLOCK_TOKENS;
        std::vector<unsigned> pool(blocks + 4);
        std::iota(pool.begin(), pool.end(), 0u);
        std::shuffle(pool.begin(), pool.end(), rng);
        for (int length : lengths) {
            c.table_starts.push_back(c.block_ids.size());
            for (int b = 0; b < (length + BLOCK_TOKENS - 1) / BLOCK_TOKENS; b++) {
                c.block_ids.push_back(pool[c.block_ids.size()]);
            }
            std::vector<float> q(length * q_width);
            // Scores of a standard deviation of 10 (sharp attention), where q rounded once to
            // f16 moved the output by 2.4e-3 of its largest value.
            for (float &x : q) x = 10.0f * normal(rng);
            c.q.push_back(q);
        }
        c.k.resize(pool.size() * BLOCK_TOKENS * kv_width);
        c.v.resize(c.k.size());
        for (__half &x : c.k) x = (__half)normal(rng);
        for (__half &x : c.v) x = (__half)normal(rng);

        std::vector<std::vector<float>> alone;
        double largest = 0, worst = 0;
        for (int s = 0; s < (int)lengths.size(); s++) {
            std::vector<std::pair<int, int>> rows;
            for (int p = 0; p < lengths[s]; p++) rows.push_back({s, p});
            alone.push_back(pass(c, rows));
            for (int p = 0; p < lengths[s]; p++) {
                for (int h = 0; h < HEADS; h++) {
                    const int kv_head = h / (HEADS / KV_HEADS);
                    const float *q = &c.q[s][p * q_width + h * head_dim];
                    std::vector<double> weights(p + 1);
                    double most = -INFINITY, total = 0;
                    for (int j = 0; j <= p; j++) {
                        const __half *k = &c.k[c.slot(s, j) * kv_width + kv_head * head_dim];
                        double score = 0;
                        for (int d = 0; d < head_dim; d++) score += (double)q[d] * (double)k[d];
                        weights[j] = score / std::sqrt((double)head_dim);
                        most = std::max(most, weights[j]);
                    }
                    for (double &w : weights) total += w = std::exp(w - most);
                    for (int d = 0; d < head_dim; d++) {
                        double value = 0;
                        for (int j = 0; j <= p; j++) {
                            value += weights[j] *
                                     (double)c.v[c.slot(s, j) * kv_width + kv_head * head_dim + d];
                        }
                        value /= total;
                        const float got = alone[s][p * q_width + h * head_dim + d];
                        largest = std::max(largest, std::fabs(value));
                        worst = std::max(worst, std::fabs(value - got));
                    }
                }
            }
        }

        std::vector<std::vector<std::pair<int, int>>> passes(1);
        for (int p = 0; p < lengths[0]; p++) {
            for (int s = 0; s < (int)lengths.size(); s++) {
                if (p < lengths[s]) passes[0].push_back({s, p});
            }
        }
        for (int start = 0; start < lengths[0]; start += 37) {
            passes.emplace_back();
            for (int s = 0; s < (int)lengths.size(); s++) {
                for (int p = start; p < std::min(lengths[s], start + 37); p++) {
                    passes.back().push_back({s, p});
                }
            }
        }
        bool same = true;
        for (const auto &rows : passes) {
            const std::vector<float> out = pass(c, rows);
            for (size_t r = 0; r < rows.size(); r++) {
                const auto [s, p] = rows[r];
                same &= memcmp(&out[r * q_width], &alone[s][p * q_width],
                               q_width * sizeof(float)) == 0;
            }
        }
        const bool close = worst <= 1e-3 * largest;
        printf("heads of %d: largest difference from float64 %.2e of the largest value (%s), "
               "passes mixing the sequences %s\n",
               head_dim, worst / largest, close ? "within 1e-3" : "ABOVE 1e-3",
               same ? "give each row the bits of one pass" : "CHANGE A ROW'S BITS");
        ok &= close && same;
    }
    return ok ? 0 : 1;
}
