// Rotary position embedding in place, with each token's cosines and sines computed on the host
// (in f64, as the CPU backend does), so every backend rotates by the same values.

#include "kv.cuh"

// The pair (h[ia], h[ib]) rotated by the angle of cosine c and sine s, in place; returns it.
static __device__ __forceinline__ float2 rotate_pair(float *h, int ia, int ib, float c, float s) {
    const float2 r = rotated(h[ia], h[ib], c, s);
    h[ia] = r.x;
    h[ib] = r.y;
    return r;
}

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
        rotate_pair(h, ia, ib, cos_table[(size_t)t * half + i], sin_table[(size_t)t * half + i]);
    }
}

// One block per token.
extern "C" __global__ void rope(float *x, const float *cos_table, const float *sin_table,
                                int cols, int head_dim, int rotary_dims, int neox) {
    AFTER_PREVIOUS_KERNEL();
    rotate_row(x, cos_table, sin_table, blockIdx.x, cols, head_dim, rotary_dims, neox);
}

// One block per token: rope on its q and k rows, and its rotated k row and its v row into its
// cache slot (store_kv's work), in one launch instead of three (a pass where each sequence has
// one token leaves this to attention.cu, with the same rotation). Each thread rotates one pair
// of q or k (the host gives the block as many threads as a token has pairs, up to 1,024) and
// puts a k pair into the cache itself, and v and k's unrotated dimensions go straight to the
// cache, so that no value waits for another thread: a token is one round trip to memory
// and back, where rotating q, then k, then copying took one each. The slot (two dependent
// loads) and the thread's first cosine and sine come from the batch's description, which only
// the host writes, so they are loaded before the wait for the previous kernel.
extern "C" __global__ void rope_store_kv(float *q, float *k, const float *v,
                                         const float *cos_table, const float *sin_table,
                                         int q_cols, int kv_cols, int head_dim, int rotary_dims,
                                         int neox, const unsigned *positions,
                                         const unsigned *table_offsets, const unsigned *block_ids,
                                         int block_tokens, __half *k_cache, __half *v_cache) {
    START_NEXT_KERNEL();
    const int t = blockIdx.x;
    const size_t slot = slot_of(positions, table_offsets, block_ids, block_tokens, t, positions[t]);
    const size_t dst = slot * kv_cols, src = (size_t)t * kv_cols;
    const int half = rotary_dims / 2;
    const int q_pairs = q_cols / head_dim * half;
    const int pairs = q_pairs + kv_cols / head_dim * half;
    // Pair p's angle is that of dimension p % half (q_pairs is a multiple of half).
    const auto angle = [&](int p) {
        const size_t at = (size_t)t * half + p % half;
        return make_float2(cos_table[at], sin_table[at]);
    };
    float2 cos_sin = (int)threadIdx.x < pairs ? angle(threadIdx.x) : make_float2(0.0f, 0.0f);
    WAIT_FOR_PREVIOUS_KERNEL();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        const bool in_k = p >= q_pairs;
        const int pair = in_k ? p - q_pairs : p;
        const int head = pair / half, i = pair % half;
        const int ia = head * head_dim + (neox ? i : 2 * i);
        const int ib = head * head_dim + (neox ? i + half : 2 * i + 1);
        float *row = in_k ? k + src : q + (size_t)t * q_cols;
        const float2 r = rotate_pair(row, ia, ib, cos_sin.x, cos_sin.y);
        if (in_k) {
            k_cache[dst + ia] = __float2half_rn(r.x);
            k_cache[dst + ib] = __float2half_rn(r.y);
        }
        if (p + (int)blockDim.x < pairs) {
            cos_sin = angle(p + blockDim.x);
        }
    }
    for (int j = threadIdx.x; j < kv_cols; j += blockDim.x) {
        v_cache[dst + j] = __float2half_rn(v[src + j]);
        if (j % head_dim >= rotary_dims) {
            k_cache[dst + j] = __float2half_rn(k[src + j]);
        }
    }
}
