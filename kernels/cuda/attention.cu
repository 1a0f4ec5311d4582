// The paged f16 KV cache: storing a batch's K and V rows in their slots, and causal
// grouped-query attention of each batch token over its own sequence.

#include "common.cuh"

// The cache slot of batch token t: its position's place in its sequence's block table, which
// starts at block_ids[table_offsets[t]].
static __device__ __forceinline__ size_t slot_of(const unsigned *positions,
                                                 const unsigned *table_offsets,
                                                 const unsigned *block_ids, int block_tokens,
                                                 int t, unsigned position) {
    const unsigned block = block_ids[table_offsets[t] + position / block_tokens];
    return (size_t)block * block_tokens + position % block_tokens;
}

// One block per token: its K and V rows, rounded to f16, into its slot.
extern "C" __global__ void store_kv(const float *k, const float *v, const unsigned *positions,
                                    const unsigned *table_offsets, const unsigned *block_ids,
                                    int block_tokens, int width, __half *k_cache,
                                    __half *v_cache) {
    const int t = blockIdx.x;
    const size_t slot = slot_of(positions, table_offsets, block_ids, block_tokens, t, positions[t]);
    const size_t dst = slot * width, src = (size_t)t * width;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        k_cache[dst + j] = __float2half_rn(k[src + j]);
        v_cache[dst + j] = __float2half_rn(v[src + j]);
    }
}

#define ATTENTION_MAX_PER_LANE 8 // head dimensions up to 256

// One warp per (token, query head): an online softmax over positions 0..=position of the
// token's sequence, whose block table starts at block_ids[table_offsets[t]].
extern "C" __global__ void attention(const float *q, const __half *k_cache, const __half *v_cache,
                                     const unsigned *positions, const unsigned *table_offsets,
                                     const unsigned *block_ids, int block_tokens, int tokens,
                                     int heads, int kv_heads, int head_dim, float scale,
                                     float *out) {
    const int item = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (item >= tokens * heads) {
        return;
    }
    const int t = item / heads, head = item % heads;
    const int kv_head = head / (heads / kv_heads);
    const int kv_width = kv_heads * head_dim;
    const float *qh = q + (size_t)t * heads * head_dim + (size_t)head * head_dim;
    float qr[ATTENTION_MAX_PER_LANE], acc[ATTENTION_MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < ATTENTION_MAX_PER_LANE; i++) {
        const int d = lane + WARP_SIZE * i;
        qr[i] = d < head_dim ? qh[d] : 0.0f;
        acc[i] = 0.0f;
    }
    float max = -INFINITY, denominator = 0.0f;
    for (unsigned p = 0; p <= positions[t]; p++) {
        const size_t slot = slot_of(positions, table_offsets, block_ids, block_tokens, t, p);
        const size_t base = slot * kv_width + (size_t)kv_head * head_dim;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < ATTENTION_MAX_PER_LANE; i++) {
            const int d = lane + WARP_SIZE * i;
            if (d < head_dim) {
                s += qr[i] * __half2float(k_cache[base + d]);
            }
        }
        s = warp_sum(s) * scale;
        const float new_max = fmaxf(max, s);
        const float correction = __expf(max - new_max);
        const float weight = __expf(s - new_max);
        denominator = denominator * correction + weight;
#pragma unroll
        for (int i = 0; i < ATTENTION_MAX_PER_LANE; i++) {
            const int d = lane + WARP_SIZE * i;
            if (d < head_dim) {
                acc[i] = acc[i] * correction + weight * __half2float(v_cache[base + d]);
            }
        }
        max = new_max;
    }
    float *o = out + (size_t)t * heads * head_dim + (size_t)head * head_dim;
#pragma unroll
    for (int i = 0; i < ATTENTION_MAX_PER_LANE; i++) {
        const int d = lane + WARP_SIZE * i;
        if (d < head_dim) {
            o[d] = acc[i] / denominator;
        }
    }
}
