// The paged f16 KV cache: storing a batch's K and V rows in their slots, and causal
// grouped-query attention of each batch token over its own sequence.

#include "kv.cuh"
#include "q8.cuh"

// One block per token: its K and V rows, rounded to f16, into its slot.
extern "C" __global__ void store_kv(const float *k, const float *v, const unsigned *positions,
                                    const unsigned *table_offsets, const unsigned *block_ids,
                                    int block_tokens, int width, __half *k_cache,
                                    __half *v_cache) {
    AFTER_PREVIOUS_KERNEL();
    store_row(k, v, positions, table_offsets, block_ids, block_tokens, width, k_cache, v_cache,
              blockIdx.x);
}

// A pass's unrotated k and v rows, for attention to rotate and store (a pass where each
// sequence has one token), with the rotary tables (rotary_dims / 2 angles per token); k null
// when rope_store_kv did that.
struct FreshKv {
    const float *k, *v, *cos, *sin;
    int rotary_dims, neox;
};

// The most warps per block (GpuTuning::MAX_ATTENTION_WARPS).
#define ATTENTION_MAX_WARPS 16

// The 32-bit words of PER_LANE halves at p (the last one's high half 0 when PER_LANE is odd),
// with the widest loads that p's alignment (2 * PER_LANE bytes, as a lane's dimensions of a
// cache row are) allows.
template <int PER_LANE>
static __device__ __forceinline__ void load_half_words(const __half *p,
                                                       unsigned words[(PER_LANE + 1) / 2]) {
    if constexpr (PER_LANE % 8 == 0) {
#pragma unroll
        for (int i = 0; i < PER_LANE / 8; i++) {
            const uint4 w = ((const uint4 *)p)[i];
            words[4 * i] = w.x;
            words[4 * i + 1] = w.y;
            words[4 * i + 2] = w.z;
            words[4 * i + 3] = w.w;
        }
    } else if constexpr (PER_LANE % 4 == 0) {
#pragma unroll
        for (int i = 0; i < PER_LANE / 4; i++) {
            const uint2 w = ((const uint2 *)p)[i];
            words[2 * i] = w.x;
            words[2 * i + 1] = w.y;
        }
    } else if constexpr (PER_LANE % 2 == 0) {
#pragma unroll
        for (int i = 0; i < PER_LANE / 2; i++) {
            words[i] = ((const unsigned *)p)[i];
        }
    } else {
        const unsigned short *h = (const unsigned short *)p;
#pragma unroll
        for (int i = 0; i < (PER_LANE + 1) / 2; i++) {
            words[i] = h[2 * i] | (2 * i + 1 < PER_LANE ? (unsigned)h[2 * i + 1] << 16 : 0u);
        }
    }
}

// Half d of the halves packed in words, as a float.
static __device__ __forceinline__ float half_at(const unsigned *words, int d) {
    return __half2float(__ushort_as_half((unsigned short)(words[d / 2] >> (16 * (d % 2)))));
}

// +0.0f, from every one of the N words: a sum that starts from it, or a factor it is added to,
// waits for all of them. Without that, ptxas issues each load of a K row or of a tile's V rows
// just before its first use, even with registers to spare, and the warp then waits one round
// trip to memory per load (on sm_90 the decode step's attention took 11.6 us per layer at 80
// positions). A subnormal times zero is +0 with or without flush-to-zero.
template <int N>
static __device__ __forceinline__ float zero_after(const unsigned *words) {
    unsigned all = 0;
#pragma unroll
    for (int i = 0; i < N; i++) {
        all ^= words[i];
    }
    return __int_as_float(all & 0x007FFFFFu) * 0.0f;
}

// The most ranges a token's positions are cut into (ATTENTION_SPLITS in
// crates/backend/src/gpu/mod.rs).
#define ATTENTION_SPLITS 8

// How many tiles of 32 positions a range of a token with `tiles` tiles takes: an eighth of them,
// rounded up to a multiple of the block's warps, so that in a block that takes the ranges in
// turn every warp has a tile in each range but the last (attention_ranges in
// crates/backend/src/gpu/mod.rs counts them).
static __device__ __forceinline__ unsigned range_tiles(unsigned tiles, unsigned warps) {
    const unsigned eighth = (tiles + ATTENTION_SPLITS - 1) / ATTENTION_SPLITS;
    return (eighth + warps - 1) / warps * warps;
}

// The factor that brings a result whose maximum score is m to the maximum `to` (0 for one that
// saw no position).
static __device__ __forceinline__ float rescale(float m, float to) {
    return m == -INFINITY ? 0.0f : __expf(m - to);
}

// Folds a softmax result (maximum m, sum s, this lane's values a) into (max, sum, acc).
template <int PER_LANE>
static __device__ __forceinline__ void fold(float &max, float &sum, float (&acc)[PER_LANE], float m,
                                            float s, const float (&a)[PER_LANE]) {
    const float to = fmaxf(max, m);
    const float old_factor = rescale(max, to), new_factor = rescale(m, to);
    sum = __fmaf_rn(sum, old_factor, __fmul_rn(s, new_factor));
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        acc[i] = __fmaf_rn(acc[i], old_factor, __fmul_rn(a[i], new_factor));
    }
    max = to;
}

// Attention of each (token, query head) of heads of 32 * PER_LANE dimensions, for the batch's
// tokens from `first` (those before it, prompt rows, may take prompt_attention.cu's kernel),
// over positions 0..=position of the token's sequence, whose block table starts at
// block_ids[table_offsets[t]]. The positions go in tiles of 32, cut into ranges of
// range_tiles() tiles, which depend on the position and `warps` (the host profile's
// attention_warps) alone. Each of the `warps` parts w takes tiles w, w + warps, ... of each
// range: each lane scores one position of the tile (a whole K row against q, held in shared
// memory), the part updates its online softmax once per tile, and each lane accumulates V over
// the tile for its own PER_LANE dimensions. A part's results for the ranges, in range order, are
// folded into its own, and the parts' are merged in a fixed order. Every product and sum that
// a compiler could contract into an FMA is spelled with a rounding intrinsic, so that each
// instance below does a head's arithmetic in the same order with the same roundings.
//
// A block takes GROUP query heads of one KV head: each of its warps loads a K row and a tile's
// V rows once for all of them, where one block per query head reads them GROUP times (a batch's
// attention is bound by those reads from L2). GROUP > 1 keeps GROUP heads' softmax state in
// registers, so its launch must give every part that has tiles a warp of its own (the host's
// AttentionLaunch does); it traps otherwise.
//
// A block's warps take its parts w, w + (its warps), ...: any number of warps gives the same
// arithmetic, so the host launches fewer than `warps` where most parts have no tile (a batch
// of short sequences), to fit several blocks on an SM (AttentionLaunch in
// crates/backend/src/gpu/mod.rs). A part without tiles adds exact zeros to the merge, which
// GROUP > 1 leaves out.
//
// A head has `blocks_per_head` blocks: one range each, so that a long sequence's K and V stream
// through as many SMs (decode and short verify passes, which have few blocks otherwise), or a
// lone block that takes every range (passes that fill the GPU without splitting). A lone block's
// parts fold each range's result as they finish it; split blocks write their parts' results to
// `parts`, and the last of a head's blocks to arrive (counted in `arrivals`, which it sets back
// to 0) folds them. The same arithmetic either way, so a token's output depends only on its own
// sequence, whatever the batch or the pass. With `quantized.hi` set, the output is also
// quantized for the output projection.
//
// A decode step's attention is a chain of dependent loads (the sequence's table, its slots, K,
// V) in a dozen blocks, so the kernel is written for few round trips: the table's and the first
// slots' loads run before the previous kernel ends, a K row's loads go out together, the tile's
// V rows, one vector load per position, all at once, and the next tile's slots with them.
//
// In a pass where each sequence has one token, attention also does rope_store_kv's work, which
// would otherwise be one more kernel, and one more wait, in each layer of a decode step: with
// `fresh.k` set, q, k and v are the projections' unrotated rows, each block rotates its heads
// of q as it loads them, and a block that takes the token's last tile rotates its kv head of k
// and stores it and v in the token's slot before its barrier, after which its warps read them
// there as any other position. The blocks of a kv head's query heads store the same bytes. The
// rotation is rope_store_kv's (kv.cuh), so the bits are those of the two kernels.
template <int PER_LANE, int GROUP>
static __device__ void attention_heads(int first, const float *q, __half *k_cache,
                                       __half *v_cache,
                                       const unsigned *positions, const unsigned *table_offsets,
                                       const unsigned *block_ids, int block_tokens, int heads,
                                       int kv_heads, float scale, int warps, int blocks_per_head,
                                       float *parts, unsigned *arrivals, float *out,
                                       QuantizedOut quantized, FreshKv fresh) {
    constexpr int HEAD_DIM = PER_LANE * WARP_SIZE;
    // A part's result for a range in `parts`: the maximum, the sum, then HEAD_DIM values.
    constexpr int PART = HEAD_DIM + 2;
    __shared__ float q_shared[GROUP][HEAD_DIM];
    __shared__ float acc_shared[ATTENTION_MAX_WARPS][HEAD_DIM];
    __shared__ float max_shared[ATTENTION_MAX_WARPS], sum_shared[ATTENTION_MAX_WARPS];
    __shared__ float factor_shared[ATTENTION_MAX_WARPS];
    __shared__ unsigned arrived;
    START_NEXT_KERNEL();
    // The block's first (token, head), counted from `first`: its heads are token_head ..
    // token_head + GROUP - 1.
    const int token_group = blockIdx.x / blocks_per_head;
    const int token_head = token_group * GROUP;
    const int t = first + token_head / heads, head = token_head % heads;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int block_warps = blockDim.x / WARP_SIZE;
    // The batch's description (positions, block tables) is written by the host alone, so the
    // chain of loads from the position to the first tile's slots runs before the wait for the
    // previous kernel, which wrote q.
    const unsigned *table = block_ids + table_offsets[t];
    const unsigned last = positions[t];
    const unsigned tiles = last / 32 + 1;
    const unsigned per_range = range_tiles(tiles, warps);
    const unsigned used = (tiles + per_range - 1) / per_range;
    const unsigned block_range = blockIdx.x % blocks_per_head;
    if (block_range >= used) {
        return;
    }
    const bool alone = blocks_per_head == 1 || used == 1;
    const unsigned first_range = alone ? 0 : block_range;
    const unsigned end_range = alone ? used : block_range + 1;
    const int kv_head = head / (heads / kv_heads);
    const int kv_width = kv_heads * HEAD_DIM;
    const unsigned first_tile = first_range * per_range;
    const unsigned end_tile = min(tiles, end_range * per_range);
    // The parts whose results are merged: all of them, or with GROUP > 1 one per warp, those
    // past them having no tiles.
    const int merged = GROUP == 1 ? warps : min(warps, block_warps);
    if (GROUP > 1 && block_warps < warps && end_tile - first_tile > (unsigned)block_warps) {
        TRAP();
    }
    // The cache slot of this lane's position in tile tile_index (0 past the sequence's end or
    // the block's tiles: a slot whose V rows are loaded and not added).
    const auto slot_in = [&](unsigned tile_index) {
        const unsigned p = 32u * tile_index + lane;
        return tile_index < end_tile && p <= last ? table[p / block_tokens] * block_tokens +
                                                        p % block_tokens
                                                  : 0u;
    };
    unsigned next_slot = slot_in(first_tile + warp);
    const bool stores = fresh.k != nullptr && end_tile == tiles;
    const size_t new_slot =
        stores ? slot_of(positions, table_offsets, block_ids, block_tokens, t, last) : 0;
    WAIT_FOR_PREVIOUS_KERNEL();
    // Row g of q, and of the output: head `head + g` of token t.
    const auto q_row = [&](int g) { return ((size_t)t * heads + head + g) * HEAD_DIM; };
    if (fresh.k == nullptr) {
        for (int i = threadIdx.x; i < GROUP * HEAD_DIM; i += blockDim.x) {
            q_shared[i / HEAD_DIM][i % HEAD_DIM] = __fmul_rn(q[q_row(0) + i], scale);
        }
    } else {
        const size_t angles = (size_t)t * (fresh.rotary_dims / 2);
        const float *cos_row = fresh.cos + angles, *sin_row = fresh.sin + angles;
        for (int i = threadIdx.x; i < GROUP * HEAD_DIM; i += blockDim.x) {
            q_shared[i / HEAD_DIM][i % HEAD_DIM] =
                __fmul_rn(rotated_dim(q + q_row(i / HEAD_DIM), i % HEAD_DIM, cos_row, sin_row,
                                      fresh.rotary_dims, fresh.neox),
                          scale);
        }
        if (stores) {
            const size_t kv_row = (size_t)t * kv_width + (size_t)kv_head * HEAD_DIM;
            const size_t kv_slot = new_slot * kv_width + (size_t)kv_head * HEAD_DIM;
            for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) {
                k_cache[kv_slot + d] = __float2half_rn(rotated_dim(
                    fresh.k + kv_row, d, cos_row, sin_row, fresh.rotary_dims, fresh.neox));
                v_cache[kv_slot + d] = __float2half_rn(fresh.v[kv_row + d]);
            }
        }
    }
    // q_shared, and the token's K and V rows for every warp of the block.
    __syncthreads();
    // Where part w's result for a range of head g goes: [token, head][range][part].
    const auto part_at = [&](int g, unsigned range, int w) {
        return parts +
               (((size_t)(token_head + g) * ATTENTION_SPLITS + range) * warps + w) * PART;
    };
    // This lane's share of part w's result (maximum, sum, values) in the block's shared memory.
    const auto keep = [&](int w, float max, float sum, const float (&acc)[PER_LANE]) {
        if (lane == 0) {
            max_shared[w] = max;
            sum_shared[w] = sum;
        }
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) {
            acc_shared[w][lane * PER_LANE + i] = acc[i];
        }
    };
    // Head g's output from the `merged` parts' results in shared memory.
    const auto merge = [&](int g) {
        __syncthreads();
        if (threadIdx.x < merged) {
            float total_max = -INFINITY;
            for (int w = 0; w < merged; w++) {
                total_max = fmaxf(total_max, max_shared[w]);
            }
            factor_shared[threadIdx.x] = rescale(max_shared[threadIdx.x], total_max);
        }
        __syncthreads();
        float total = 0.0f;
        for (int w = 0; w < merged; w++) {
            total = __fmaf_rn(sum_shared[w], factor_shared[w], total);
        }
        for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) {
            float value = 0.0f;
            for (int w = 0; w < merged; w++) {
                value = __fmaf_rn(acc_shared[w][d], factor_shared[w], value);
            }
            const float result = __fdiv_rn(value, total);
            out[q_row(g) + d] = result;
            // Each warp writes 32 consecutive values, one group of the quantized copy the
            // output projection takes (HEAD_DIM is a multiple of 32, so every lane of the
            // warp is here).
            if (quantized.hi != nullptr) {
                quantize_group(result, (long long)(q_row(g) + d) / WARP_SIZE, quantized);
            }
        }
        // The results are read before the next head's replace them.
        if (g + 1 < GROUP) {
            __syncthreads();
        }
    };
    // The registers a K row's or V rows' loads in flight take.
    constexpr int V_REGISTERS = GROUP == 1 ? 64 : GROUP == 2 ? 32 : 16;
    // Each head's result over the ranges its part has finished (with GROUP > 1, this warp's
    // one part with tiles).
    float max[GROUP], sum[GROUP], acc[GROUP][PER_LANE];
    for (int w = warp; w < merged; w += block_warps) {
        // And over the tiles of the current range.
        float range_max[GROUP], range_sum[GROUP], range_acc[GROUP][PER_LANE];
#pragma unroll
        for (int g = 0; g < GROUP; g++) {
            max[g] = range_max[g] = -INFINITY;
            sum[g] = range_sum[g] = 0.0f;
#pragma unroll
            for (int i = 0; i < PER_LANE; i++) {
                acc[g][i] = range_acc[g][i] = 0.0f;
            }
        }
        if (w != warp) {
            next_slot = slot_in(first_tile + w);
        }
        for (unsigned tile_index = first_tile + w; tile_index < end_tile; tile_index += warps) {
            const unsigned tile = 32u * tile_index;
            const bool valid = tile + lane <= last;
            // The next tile's slot is asked for while this one is scored.
            const unsigned slot = next_slot;
            next_slot = slot_in(tile_index + warps);
            float score[GROUP];
#pragma unroll
            for (int g = 0; g < GROUP; g++) {
                score[g] = -INFINITY;
            }
            if (valid) {
                // The K row in chunks that fill at most V_REGISTERS registers; each chunk's
                // loads go out together. A chunk after the first adds +0, which changes a
                // score's bits at most from -0 to +0, and no result with them.
                const __half *k = k_cache + (size_t)slot * kv_width + (size_t)kv_head * HEAD_DIM;
                constexpr int K_WORDS = HEAD_DIM / 2 < V_REGISTERS ? HEAD_DIM / 2 : V_REGISTERS;
#pragma unroll
                for (int c = 0; c < HEAD_DIM / 2; c += K_WORDS) {
                    unsigned row[K_WORDS];
                    load_half_words<2 * K_WORDS>(k + 2 * c, row);
                    const float zero = zero_after<K_WORDS>(row);
#pragma unroll
                    for (int g = 0; g < GROUP; g++) {
                        score[g] = c == 0 ? zero : __fadd_rn(score[g], zero);
                    }
#pragma unroll
                    for (int d = 0; d < 2 * K_WORDS; d += 2) {
                        const float2 f = __half22float2(*(const __half2 *)&row[d / 2]);
#pragma unroll
                        for (int g = 0; g < GROUP; g++) {
                            score[g] = __fmaf_rn(q_shared[g][2 * c + d + 1], f.y,
                                                 __fmaf_rn(q_shared[g][2 * c + d], f.x, score[g]));
                        }
                    }
                }
            }
            float weight[GROUP];
#pragma unroll
            for (int g = 0; g < GROUP; g++) {
                const float new_max = fmaxf(range_max[g], warp_max(score[g]));
                const float correction = __expf(range_max[g] - new_max);
                weight[g] = valid ? __expf(score[g] - new_max) : 0.0f;
                range_sum[g] = __fmaf_rn(range_sum[g], correction, warp_sum(weight[g]));
#pragma unroll
                for (int i = 0; i < PER_LANE; i++) {
                    range_acc[g][i] = __fmul_rn(range_acc[g][i], correction);
                }
                range_max[g] = new_max;
            }
            const int count = min(32, (int)(last - tile) + 1);
            // The V rows of a group of positions, this lane's dimensions of each, all loaded
            // before any is used (past the sequence's end those of slot 0, a lane's slot
            // there); only the sequence's positions are added.
            constexpr int WORDS = (PER_LANE + 1) / 2;
            constexpr int V_ROWS =
                V_REGISTERS / WORDS < WARP_SIZE ? V_REGISTERS / WORDS : WARP_SIZE;
#pragma unroll
            for (int j0 = 0; j0 < WARP_SIZE; j0 += V_ROWS) {
                unsigned v[V_ROWS * WORDS];
#pragma unroll
                for (int j = 0; j < V_ROWS; j++) {
                    load_half_words<PER_LANE>(v_cache + (size_t)SHFL(slot, j0 + j) * kv_width +
                                                  (size_t)kv_head * HEAD_DIM +
                                                  (size_t)lane * PER_LANE,
                                              v + j * WORDS);
                }
                const float zero = zero_after<V_ROWS * WORDS>(v);
#pragma unroll
                for (int j = 0; j < V_ROWS; j++) {
#pragma unroll
                    for (int g = 0; g < GROUP; g++) {
                        // The weights are at least +0, so adding +0 changes none.
                        const float weight_j = __fadd_rn(SHFL(weight[g], j0 + j), zero);
                        if (j0 + j < count) {
#pragma unroll
                            for (int i = 0; i < PER_LANE; i++) {
                                range_acc[g][i] = __fmaf_rn(weight_j, half_at(v + j * WORDS, i),
                                                            range_acc[g][i]);
                            }
                        }
                    }
                }
            }
            // A lone block's part folds each range's result once it has its last tile (a
            // range without tiles of the part's would fold as nothing: (-inf, 0, 0)).
            const unsigned next = tile_index + warps;
            if (alone && (next >= end_tile || next / per_range != tile_index / per_range)) {
#pragma unroll
                for (int g = 0; g < GROUP; g++) {
                    fold(max[g], sum[g], acc[g], range_max[g], range_sum[g], range_acc[g]);
                    range_max[g] = -INFINITY;
                    range_sum[g] = 0.0f;
#pragma unroll
                    for (int i = 0; i < PER_LANE; i++) {
                        range_acc[g][i] = 0.0f;
                    }
                }
            }
        }
        if (!alone) {
#pragma unroll
            for (int g = 0; g < GROUP; g++) {
                float *part = part_at(g, first_range, w);
                if (lane == 0) {
                    part[0] = range_max[g];
                    part[1] = range_sum[g];
                }
#pragma unroll
                for (int i = 0; i < PER_LANE; i++) {
                    part[2 + lane * PER_LANE + i] = range_acc[g][i];
                }
            }
        } else if (GROUP == 1) {
            keep(w, max[0], sum[0], acc[0]);
        }
    }
    if (!alone) {
        // The results are visible to every block before this block's arrival counts.
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            arrived = atomicAdd(&arrivals[token_head], 1u);
        }
        __syncthreads();
        if (arrived != used - 1) {
            return;
        }
        __threadfence();
        if (threadIdx.x == 0) {
            arrivals[token_head] = 0;
        }
        // Every block's results are there: each part's are folded in range order, read through
        // volatile (past this SM's cache, for those other blocks wrote).
        for (int w = warp; w < merged; w += block_warps) {
#pragma unroll
            for (int g = 0; g < GROUP; g++) {
                max[g] = -INFINITY;
                sum[g] = 0.0f;
#pragma unroll
                for (int i = 0; i < PER_LANE; i++) {
                    acc[g][i] = 0.0f;
                }
                for (unsigned range = 0; range < used; range++) {
                    const volatile float *part = part_at(g, range, w);
                    float range_acc[PER_LANE];
#pragma unroll
                    for (int i = 0; i < PER_LANE; i++) {
                        range_acc[i] = part[2 + lane * PER_LANE + i];
                    }
                    fold(max[g], sum[g], acc[g], part[0], part[1], range_acc);
                }
            }
            if (GROUP == 1) {
                keep(w, max[0], sum[0], acc[0]);
            }
        }
    }
    if (GROUP == 1) {
        merge(0);
    } else {
#pragma unroll
        for (int g = 0; g < GROUP; g++) {
            if (warp < merged) {
                keep(warp, max[g], sum[g], acc[g]);
            }
            merge(g);
        }
    }
}

// attention_heads for heads of `head_dim` dimensions, GROUP query heads a block, as
// attention_<head_dim> (one head a block) or attention_<head_dim>_x<group>.
#define ATTENTION_INSTANCE(head_dim, group, name)                                              \
    extern "C" __global__ void __launch_bounds__(ATTENTION_MAX_WARPS *WARP_SIZE) name(         \
        int first, const float *q, __half *k_cache, __half *v_cache,                           \
        const unsigned *positions, const unsigned *table_offsets, const unsigned *block_ids,   \
        int block_tokens, int heads, int kv_heads, float scale, int warps,                     \
        int blocks_per_head, float *parts, unsigned *arrivals, float *out,                     \
        QuantizedOut quantized,                                                                \
        const float *fresh_k, const float *fresh_v, const float *cos_table,                    \
        const float *sin_table, int rotary_dims, int neox) {                                   \
        attention_heads<head_dim / WARP_SIZE, group>(                                          \
            first, q, k_cache, v_cache, positions, table_offsets, block_ids, block_tokens,     \
            heads, kv_heads, scale, warps, blocks_per_head, parts, arrivals, out, quantized,   \
            {fresh_k, fresh_v, cos_table, sin_table, rotary_dims, neox});                      \
    }
// Every multiple of 32 up to 256 (HEAD_DIMS in crates/backend/src/gpu/mod.rs).
ATTENTION_INSTANCE(32, 1, attention_32)
ATTENTION_INSTANCE(64, 1, attention_64)
ATTENTION_INSTANCE(96, 1, attention_96)
ATTENTION_INSTANCE(128, 1, attention_128)
ATTENTION_INSTANCE(160, 1, attention_160)
ATTENTION_INSTANCE(192, 1, attention_192)
ATTENTION_INSTANCE(224, 1, attention_224)
ATTENTION_INSTANCE(256, 1, attention_256)
// Groups of 2, 3 and 4 query heads, for heads of 64 and 128 dimensions (GROUPED_ATTENTION in
// crates/backend/src/gpu/mod.rs): more heads' states spill from registers.
ATTENTION_INSTANCE(64, 2, attention_64_x2)
ATTENTION_INSTANCE(64, 3, attention_64_x3)
ATTENTION_INSTANCE(64, 4, attention_64_x4)
ATTENTION_INSTANCE(128, 2, attention_128_x2)
ATTENTION_INSTANCE(128, 3, attention_128_x3)
ATTENTION_INSTANCE(128, 4, attention_128_x4)
