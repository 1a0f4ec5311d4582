// Causal attention of a pass's prompt rows on the tensor cores (flash attention: Q K^T and P V
// as f16 mma with f32 accumulators, an online softmax between them), launched where the host
// profile's `prompt_attention` asks for it. attention.cu's kernel gives each (token, head) its
// own block, which reads every K and V row of the prefix for itself; here a block's 64 query
// rows share each tile of 64 positions it copies into shared memory, and multiply it on the
// tensor cores.
//
// Its bits are not attention.cu's, so it takes prompt rows only (a generated token's row stays
// on attention.cu, README "Prefill through an f16 GEMM"), and it gives a row the same bits
// whatever rows share its block, whatever the pass: the property the batcher's chunked prefill
// and the prefix cache rely on. A row's arithmetic depends on its own q and on its sequence's K
// and V at positions 0..=its position, and on nothing else:
// - the positions go in tiles of 64 from position 0, fixed by the position alone; the block
//   takes the tiles up to its segment's last position, and a tile wholly past a row's position
//   changes nothing of the row (its maximum stays, its factor is exactly 1, its weights are +0
//   and add +0);
// - an mma's accumulator of row r depends on row r of A alone, and its k16 steps go in order;
// - within a tile a weight past the row's position is +0, times a V value that is finite: the
//   sequence's own rows (written before this kernel) or zeros, which the copy fills past the
//   segment's last position, so that no slot of another sequence, or never written, takes part;
// - a row's maximum and sum over a tile are reduced over the four lanes holding it in a fixed
//   order.
//
// The mma instructions exist from sm_80; HIP builds none of this (crates/backend/build.rs).

#include "mma.cuh"
#include "q8.cuh"

#if !defined(__HIP__)

// Warps per block, each taking 16 query rows of the block's PROMPT_ATTENTION_ROWS (the
// backend's PROMPT_ATTENTION_ROWS).
#define PROMPT_ATTENTION_WARPS 4
#define PROMPT_ATTENTION_ROWS (16 * PROMPT_ATTENTION_WARPS)
// Positions per tile of K and V.
#define PROMPT_ATTENTION_TILE 64

// Query head `blockIdx.x % heads` of batch rows [PROMPT_ATTENTION_ROWS * b, ... + 64) (b =
// blockIdx.x / heads) that are below `rows`, the pass's prompt rows, which lead the batch. The
// rows may belong to several sequences (a block's rows are cut at each change of block table
// into segments, each attending over its own sequence); q, out and the quantized copy are laid
// out as attention.cu's.
template <int HEAD_DIM>
static __device__ void prompt_attention_heads(const float *q, const __half *k_cache,
                                              const __half *v_cache, const unsigned *positions,
                                              const unsigned *table_offsets,
                                              const unsigned *block_ids, int block_tokens,
                                              int rows, int heads, int kv_heads, float scale,
                                              float *out, QuantizedOut quantized) {
    static_assert(HEAD_DIM % 16 == 0, "heads of whole k16 steps");
    // A tile row padded by 16 bytes: ldmatrix's eight rows then fall on distinct banks.
    constexpr int LD = HEAD_DIM + 8;
    constexpr int TILE = PROMPT_ATTENTION_TILE;
    constexpr int CHUNKS = HEAD_DIM / 8; // 16-byte copies per K or V row
    __shared__ __align__(16) __half tiles[2 * TILE * LD];
    __half *const k_tile = tiles, *const v_tile = tiles + TILE * LD;
    // Each warp's 16 results, staged for writing (the tiles' memory, free by then).
    float *const results = reinterpret_cast<float *>(tiles);
    static_assert(PROMPT_ATTENTION_ROWS * HEAD_DIM * sizeof(float) <= sizeof(tiles),
                  "the results fit the tiles' memory");
    START_NEXT_KERNEL();
    const int head = blockIdx.x % heads;
    const int first = blockIdx.x / heads * PROMPT_ATTENTION_ROWS;
    const int end = min(rows, first + PROMPT_ATTENTION_ROWS);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int kv_head = head / (heads / kv_heads);
    const size_t kv_width = (size_t)kv_heads * HEAD_DIM, q_width = (size_t)heads * HEAD_DIM;
    // The warp's rows, and the two rows of the mma fragments this lane holds.
    const int warp_first = first + 16 * warp;
    const int lane_rows[2] = {warp_first + lane / 4, warp_first + lane / 4 + 8};
    WAIT_FOR_PREVIOUS_KERNEL();
    for (int segment = first; segment < end;) {
        // The rows of one sequence from `segment`, and the last position any of them sees.
        const unsigned table_offset = table_offsets[segment];
        int segment_end = segment + 1;
        unsigned last = positions[segment];
        while (segment_end < end && table_offsets[segment_end] == table_offset) {
            last = max(last, positions[segment_end]);
            segment_end++;
        }
        const unsigned *table = block_ids + table_offset;
        const bool warp_takes_part = warp_first < segment_end && warp_first + 16 > segment;
        // A row outside the segment computes over position 0 alone (finite, never written).
        bool in_segment[2];
        unsigned limit[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            in_segment[h] = lane_rows[h] >= segment && lane_rows[h] < segment_end;
            limit[h] = in_segment[h] ? positions[lane_rows[h]] : 0u;
        }
        // q's A fragments, scaled, as two f16 parts: the value rounded, and what rounding
        // left. Per k16 step, (row, k lo), (row + 8, k lo), (row, k hi), (row + 8, k hi), k lo
        // being columns 2 (lane % 4) and the next. Rounded once, q moved each score by up to
        // 2^-11 of the size of its products, so the larger the scores the further the
        // weights moved; with the rest, one more mma per product, the weights' own rounding
        // to f16 is what is left (tests/cuda/emulate, heads of 128 and scores of a standard
        // deviation of 10: 1.8e-3 of the largest output from float64 before, 1.1e-4 after).
        unsigned q_frag[HEAD_DIM / 16][4], q_rest[HEAD_DIM / 16][4];
#pragma unroll
        for (int step = 0; step < HEAD_DIM / 16; step++) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float2 v = make_float2(0.0f, 0.0f);
                    if (in_segment[h]) {
                        v = *reinterpret_cast<const float2 *>(
                            q + (size_t)lane_rows[h] * q_width + (size_t)head * HEAD_DIM +
                            16 * step + 8 * half + 2 * (lane % 4));
                    }
                    const float x = v.x * scale, y = v.y * scale;
                    q_frag[step][h + 2 * half] = half2_bits(x, y);
                    q_rest[step][h + 2 * half] =
                        half2_bits(x - (float)(__half)x, y - (float)(__half)y);
                }
            }
        }
        float acc[HEAD_DIM / 8][4] = {};
        float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
        // Copies the rows of K or V (`cache`) at tile `tile`'s positions into `into`, zeros past
        // the segment's last position, as one group of copies.
        const auto copy_tile = [&](__half *into, const __half *cache, unsigned tile) {
            for (int c = threadIdx.x; c < TILE * CHUNKS; c += PROMPT_ATTENTION_WARPS * WARP_SIZE) {
                const int i = c / CHUNKS, chunk = c % CHUNKS;
                const unsigned p = tile * TILE + i;
                const bool valid = p <= last;
                const size_t slot =
                    valid ? (size_t)table[p / block_tokens] * block_tokens + p % block_tokens : 0;
                cp_async16(into + i * LD + 8 * chunk,
                           cache + slot * kv_width + (size_t)kv_head * HEAD_DIM + 8 * chunk, valid);
            }
            cp_async_commit();
        };
        const unsigned tiles_to_take = last / TILE + 1;
        // A tile's V is copied while its scores are computed, and the next tile's K while its
        // weights multiply V: one group in flight behind the one waited for, the tiles' memory
        // reused once every warp is past its last read (the results of the segment before
        // included).
        __syncthreads();
        copy_tile(k_tile, k_cache, 0);
        for (unsigned tile = 0; tile < tiles_to_take; tile++) {
            copy_tile(v_tile, v_cache, tile);
            cp_async_wait<1>();
            __syncthreads();
            // Scores of the warp's 16 rows against the tile's 64 positions, then their
            // weights: accumulator j holds positions 8j + 2 (lane % 4) and the next, for rows
            // lane / 4 and + 8.
            float score[TILE / 8][4] = {};
            if (warp_takes_part) {
#pragma unroll
                for (int step = 0; step < HEAD_DIM / 16; step++) {
#pragma unroll
                    for (int j = 0; j < TILE / 16; j++) {
                        // Matrices 0 and 1: positions 16j..+7 at k and k + 8; 2 and 3:
                        // 16j+8..+15.
                        unsigned b[4];
                        ldmatrix_x4(b, k_tile + (16 * j + lane / 16 * 8 + lane % 8) * LD +
                                           16 * step + (lane / 8) % 2 * 8);
                        mma_f16(score[2 * j], q_frag[step], b[0], b[1]);
                        mma_f16(score[2 * j + 1], q_frag[step], b[2], b[3]);
                        mma_f16(score[2 * j], q_rest[step], b[0], b[1]);
                        mma_f16(score[2 * j + 1], q_rest[step], b[2], b[3]);
                    }
                }
                float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
                for (int j = 0; j < TILE / 8; j++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const unsigned p = tile * TILE + 8 * j + 2 * (lane % 4) + e % 2;
                        if (p > limit[e / 2]) {
                            score[j][e] = -INFINITY;
                        }
                        tile_max[e / 2] = fmaxf(tile_max[e / 2], score[j][e]);
                    }
                }
                float factor[2], tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    tile_max[h] = fmaxf(tile_max[h], SHFL_XOR(tile_max[h], 1));
                    tile_max[h] = fmaxf(tile_max[h], SHFL_XOR(tile_max[h], 2));
                    const float to = fmaxf(row_max[h], tile_max[h]);
                    // Exactly 1 where the maximum stays (a tile wholly past the row's
                    // position); exp(-inf) = +0 where the row saw nothing yet.
                    factor[h] = to == row_max[h] ? 1.0f : __expf(row_max[h] - to);
                    row_max[h] = to;
                }
                // The weights (exp(-inf) is +0), in place of the scores.
#pragma unroll
                for (int j = 0; j < TILE / 8; j++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        score[j][e] = __expf(score[j][e] - row_max[e / 2]);
                        tile_sum[e / 2] += score[j][e];
                    }
                }
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    tile_sum[h] += SHFL_XOR(tile_sum[h], 1);
                    tile_sum[h] += SHFL_XOR(tile_sum[h], 2);
                    row_sum[h] = row_sum[h] * factor[h] + tile_sum[h];
                }
#pragma unroll
                for (int n = 0; n < HEAD_DIM / 8; n++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        acc[n][e] *= factor[e / 2];
                    }
                }
            }
            __syncthreads();
            if (tile + 1 < tiles_to_take) {
                copy_tile(k_tile, k_cache, tile + 1);
            } else {
                cp_async_commit();
            }
            cp_async_wait<1>();
            __syncthreads();
            if (warp_takes_part) {
                // P V: the weights' accumulators are the A fragments of positions 16t..16t+15.
#pragma unroll
                for (int t = 0; t < TILE / 16; t++) {
                    const unsigned p_frag[4] = {
                        half2_bits(score[2 * t][0], score[2 * t][1]),
                        half2_bits(score[2 * t][2], score[2 * t][3]),
                        half2_bits(score[2 * t + 1][0], score[2 * t + 1][1]),
                        half2_bits(score[2 * t + 1][2], score[2 * t + 1][3]),
                    };
#pragma unroll
                    for (int n = 0; n < HEAD_DIM / 16; n++) {
                        // Matrices 0 and 1: dimensions 16n..+7 at positions 16t and 16t + 8;
                        // 2 and 3: 16n+8..+15.
                        unsigned b[4];
                        ldmatrix_x4_trans(b, v_tile +
                                                 (16 * t + (lane / 8) % 2 * 8 + lane % 8) * LD +
                                                 16 * n + lane / 16 * 8);
                        mma_f16(acc[2 * n], p_frag, b[0], b[1]);
                        mma_f16(acc[2 * n + 1], p_frag, b[2], b[3]);
                    }
                }
            }
            __syncthreads();
        }
        // The last barrier above also frees the tiles' memory for the results.
        if (warp_takes_part) {
            float *const staged = results + warp * 16 * HEAD_DIM;
#pragma unroll
            for (int n = 0; n < HEAD_DIM / 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    staged[(lane / 4 + 8 * (e / 2)) * HEAD_DIM + 8 * n + 2 * (lane % 4) + e % 2] =
                        acc[n][e] / row_sum[e / 2];
                }
            }
            __syncwarp();
            for (int r = max(segment - warp_first, 0); r < min(segment_end - warp_first, 16);
                 r++) {
                const size_t row = (size_t)(warp_first + r) * q_width + (size_t)head * HEAD_DIM;
                // Each 32 consecutive values are one group of the quantized copy the output
                // projection takes (every instance's HEAD_DIM is a multiple of 32).
#pragma unroll
                for (int d = 0; d < HEAD_DIM; d += WARP_SIZE) {
                    const float value = staged[r * HEAD_DIM + d + lane];
                    out[row + d + lane] = value;
                    if (quantized.hi != nullptr) {
                        quantize_group(value, (long long)(row + d) / WARP_SIZE, quantized);
                    }
                }
            }
        }
        segment = segment_end;
    }
}

// prompt_attention_heads for heads of `head_dim` dimensions, as prompt_attention_<head_dim>.
#define PROMPT_ATTENTION_INSTANCE(head_dim)                                                    \
    extern "C" __global__ void __launch_bounds__(PROMPT_ATTENTION_WARPS *WARP_SIZE)            \
        prompt_attention_##head_dim(                                                           \
            const float *q, const __half *k_cache, const __half *v_cache,                      \
            const unsigned *positions, const unsigned *table_offsets,                          \
            const unsigned *block_ids, int block_tokens, int rows, int heads, int kv_heads,    \
            float scale, float *out, QuantizedOut quantized) {                                 \
        prompt_attention_heads<head_dim>(q, k_cache, v_cache, positions, table_offsets,        \
                                         block_ids, block_tokens, rows, heads, kv_heads, scale, \
                                         out, quantized);                                      \
    }
// Heads of 32 to 128 dimensions (PROMPT_ATTENTION_HEAD_DIMS in crates/backend/src/gpu/mod.rs):
// wider ones would hold more accumulators than a thread's registers; their prompt rows take
// attention.cu's kernel.
PROMPT_ATTENTION_INSTANCE(32)
PROMPT_ATTENTION_INSTANCE(64)
PROMPT_ATTENTION_INSTANCE(96)
PROMPT_ATTENTION_INSTANCE(128)

#endif
