// Rotary position embedding in place, with each token's cosines and sines computed on the host
// (in f64, as the CPU backend does), so every backend rotates by the same values.

#include "common.cuh"

// One block per token; threads over (head, pair). `neox` pairs (i, i + rotary_dims/2), else
// adjacent dimensions (2i, 2i+1).
extern "C" __global__ void rope(float *x, const float *cos_table, const float *sin_table,
                                int cols, int head_dim, int rotary_dims, int neox) {
    const int t = blockIdx.x;
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
