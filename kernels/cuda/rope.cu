// Rotary position embedding in place, with each token's cosines and sines computed on the host
// (in f64, as the CPU backend does), so every backend rotates by the same values.

#include "kv.cuh"

// Rotates the heads of token t's row of `cols` values (its pairs spread over the block's
// threads). `neox` pairs (i, i + rotary_dims/2), else adjacent dimensions (2i, 2i+1).
static __device__ __forceinline__ void rotate_row(float *x, const float *cos_table,
                                                  const float *sin_table, int t, int cols,
                                                  int head_dim, int rotary_dims, int neox) {
    const int half = rotary_dims / 2;
    const int heads = cols / head_dim;
    for (int k = threadIdx.x; k < heads * half; k += blockDim.x) {
        const int head = k / half, i = k % half;
        float *h = x + (size_t)t * cols + (size_t)head * head_dim;
        const int ia = neox ? i : 2 * i;
        const int ib = neox ? i + half : 2 * i + 1;
        const float c = cos_table[(size_t)t * half + i], s = sin_table[(size_t)t * half + i];
        const float a = h[ia], b = h[ib];
        h[ia] = a * c - b * s;
        h[ib] = a * s + b * c;
    }
}

// One block per token.
extern "C" __global__ void rope(float *x, const float *cos_table, const float *sin_table,
                                int cols, int head_dim, int rotary_dims, int neox) {
    AFTER_PREVIOUS_KERNEL();
    rotate_row(x, cos_table, sin_table, blockIdx.x, cols, head_dim, rotary_dims, neox);
}

// One block per token: rope on its q and k rows, then its rotated k row and its v row into its
// cache slot (store_kv's work), in one launch instead of three.
extern "C" __global__ void rope_store_kv(float *q, float *k, const float *v,
                                         const float *cos_table, const float *sin_table,
                                         int q_cols, int kv_cols, int head_dim, int rotary_dims,
                                         int neox, const unsigned *positions,
                                         const unsigned *table_offsets, const unsigned *block_ids,
                                         int block_tokens, __half *k_cache, __half *v_cache) {
    AFTER_PREVIOUS_KERNEL();
    const int t = blockIdx.x;
    rotate_row(q, cos_table, sin_table, t, q_cols, head_dim, rotary_dims, neox);
    rotate_row(k, cos_table, sin_table, t, kv_cols, head_dim, rotary_dims, neox);
    // The copy reads values other threads rotated.
    __syncthreads();
    store_row(k, v, positions, table_offsets, block_ids, block_tokens, kv_cols, k_cache, v_cache,
              t);
}
