// The paged f16 KV cache's layout, for the kernels that write it (attention.cu's store_kv,
// rope.cu's rope_store_kv): per layer, [block][slot][kv_head][head_dim].
#pragma once

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

// Batch token t's K and V rows of `width` values, rounded to f16, into its slot; the block's
// threads share the columns.
static __device__ __forceinline__ void store_row(const float *k, const float *v,
                                                 const unsigned *positions,
                                                 const unsigned *table_offsets,
                                                 const unsigned *block_ids, int block_tokens,
                                                 int width, __half *k_cache, __half *v_cache,
                                                 int t) {
    const size_t slot = slot_of(positions, table_offsets, block_ids, block_tokens, t, positions[t]);
    const size_t dst = slot * width, src = (size_t)t * width;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        k_cache[dst + j] = __float2half_rn(k[src + j]);
        v_cache[dst + j] = __float2half_rn(v[src + j]);
    }
}
