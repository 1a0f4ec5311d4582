// The paged f16 KV cache's layout, for the kernels that write it (attention.cu's store_kv and
// attention, rope.cu's rope_store_kv): per layer, [block][slot][kv_head][head_dim]; and the
// rotation of q and k that precedes the store.
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

// The pair (a, b) rotated by the angle of cosine c and sine s, each product rounded before the
// sum or difference, as the CPU backend rotates. Spelled with rounding intrinsics so that no
// compiler contracts it into an FMA in one kernel and not in another: rope_store_kv and
// attention's own rotation (a pass of one token per sequence) give the same bits.
static __device__ __forceinline__ float2 rotated(float a, float b, float c, float s) {
    return make_float2(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)),
                       __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
}

// Dimension d of head h rotated by a token's angles (cos_row and sin_row, rotary_dims / 2 of
// each): `neox` pairs (i, i + rotary_dims/2), else adjacent dimensions (2i, 2i+1); dimensions
// from rotary_dims on stay as they are.
static __device__ __forceinline__ float rotated_dim(const float *h, int d, const float *cos_row,
                                                    const float *sin_row, int rotary_dims,
                                                    int neox) {
    if (d >= rotary_dims) {
        return h[d];
    }
    const int half = rotary_dims / 2;
    const int i = neox ? d % half : d / 2;
    const bool second = neox ? d >= half : d % 2 == 1;
    const float2 r = neox ? rotated(h[i], h[i + half], cos_row[i], sin_row[i])
                          : rotated(h[2 * i], h[2 * i + 1], cos_row[i], sin_row[i]);
    return second ? r.y : r.x;
}
