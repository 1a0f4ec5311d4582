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

// The most warps per block (GpuTuning::MAX_ATTENTION_WARPS) and the widest head.
#define ATTENTION_MAX_WARPS 16
#define ATTENTION_MAX_HEAD_DIM 256
#define ATTENTION_MAX_PER_LANE (ATTENTION_MAX_HEAD_DIM / WARP_SIZE)

// One block per (token, query head), of as many warps as the launch has (the host profile's
// attention_warps), over positions 0..=position of the token's sequence, whose block table
// starts at block_ids[table_offsets[t]]. The positions go in tiles of 32, warp w of W taking
// tiles w, w + W, ...: each lane scores one
// position of the tile (a whole K row against q, held in shared memory), the warp updates its
// online softmax once per tile, and each lane accumulates V over the tile for its own
// head_dim / 32 dimensions. The warps' partial results are merged in a fixed order, so a token's
// output depends only on its own sequence. head_dim must be a multiple of 32 (the caller checks).
// With `quantized.hi` set, the output is also quantized for the output projection.
extern "C" __global__ void attention(const float *q, const __half *k_cache, const __half *v_cache,
                                     const unsigned *positions, const unsigned *table_offsets,
                                     const unsigned *block_ids, int block_tokens, int tokens,
                                     int heads, int kv_heads, int head_dim, float scale,
                                     float *out, QuantizedOut quantized) {
    __shared__ float q_shared[ATTENTION_MAX_HEAD_DIM];
    __shared__ float acc_shared[ATTENTION_MAX_WARPS][ATTENTION_MAX_HEAD_DIM];
    __shared__ float max_shared[ATTENTION_MAX_WARPS], sum_shared[ATTENTION_MAX_WARPS];
    __shared__ float factor_shared[ATTENTION_MAX_WARPS];
    AFTER_PREVIOUS_KERNEL();
    const int t = blockIdx.x / heads, head = blockIdx.x % heads;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    const int kv_head = head / (heads / kv_heads);
    const int kv_width = kv_heads * head_dim;
    const int per_lane = head_dim / WARP_SIZE;
    const size_t q_row = (size_t)t * heads * head_dim + (size_t)head * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        q_shared[d] = q[q_row + d] * scale;
    }
    __syncthreads();
    const unsigned last = positions[t];
    const unsigned *table = block_ids + table_offsets[t];
    float max = -INFINITY, sum = 0.0f, acc[ATTENTION_MAX_PER_LANE] = {0};
    for (unsigned tile = 32u * warp; tile <= last; tile += 32u * warps) {
        const unsigned p = tile + lane;
        const bool valid = p <= last;
        unsigned slot = 0;
        float score = -INFINITY;
        if (valid) {
            slot = table[p / block_tokens] * block_tokens + p % block_tokens;
            const __half *k = k_cache + (size_t)slot * kv_width + (size_t)kv_head * head_dim;
            score = 0.0f;
            // Unrolled so that a lane's K loads are in flight together.
#pragma unroll 8
            for (int d = 0; d < head_dim; d += 8) {
                const uint4 packed = *(const uint4 *)(k + d);
                const __half2 *h = (const __half2 *)&packed;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float2 f = __half22float2(h[i]);
                    score += q_shared[d + 2 * i] * f.x + q_shared[d + 2 * i + 1] * f.y;
                }
            }
        }
        const float new_max = fmaxf(max, warp_max(score));
        const float correction = __expf(max - new_max);
        const float weight = valid ? __expf(score - new_max) : 0.0f;
        sum = sum * correction + warp_sum(weight);
#pragma unroll
        for (int i = 0; i < ATTENTION_MAX_PER_LANE; i++) {
            acc[i] *= correction;
        }
        const int count = min(32, (int)(last - tile) + 1);
        // A fixed trip count, unrolled, so that the V rows of several positions are loaded
        // together (one at a time, a tile cost 32 round trips to memory); the shuffles stay
        // outside the test, which is the same for the whole warp.
#pragma unroll 8
        for (int j = 0; j < WARP_SIZE; j++) {
            const float w = SHFL(weight, j);
            const unsigned slot_j = SHFL(slot, j);
            if (j < count) {
                const __half *v = v_cache + (size_t)slot_j * kv_width +
                                  (size_t)kv_head * head_dim + (size_t)lane * per_lane;
#pragma unroll
                for (int i = 0; i < ATTENTION_MAX_PER_LANE; i++) {
                    if (i < per_lane) {
                        acc[i] += w * __half2float(v[i]);
                    }
                }
            }
        }
        max = new_max;
    }
    if (lane == 0) {
        max_shared[warp] = max;
        sum_shared[warp] = sum;
    }
#pragma unroll
    for (int i = 0; i < ATTENTION_MAX_PER_LANE; i++) {
        if (i < per_lane) {
            acc_shared[warp][lane * per_lane + i] = acc[i];
        }
    }
    __syncthreads();
    if (threadIdx.x < warps) {
        float total_max = -INFINITY;
        for (int w = 0; w < warps; w++) {
            total_max = fmaxf(total_max, max_shared[w]);
        }
        // A warp that saw no position has max -inf and contributes nothing.
        const float m = max_shared[threadIdx.x];
        factor_shared[threadIdx.x] = m == -INFINITY ? 0.0f : __expf(m - total_max);
    }
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < warps; w++) {
        total += sum_shared[w] * factor_shared[w];
    }
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float value = 0.0f;
        for (int w = 0; w < warps; w++) {
            value += acc_shared[w][d] * factor_shared[w];
        }
        out[q_row + d] = value / total;
        // Warp w writes 32 consecutive values, one group of the quantized copy the output
        // projection takes (head_dim is a multiple of 32, so every lane of the warp is here).
        if (quantized.hi != nullptr) {
            quantize_group(value / total, (long long)(q_row + d) / WARP_SIZE, quantized);
        }
    }
}
