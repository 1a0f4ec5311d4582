// RMS normalisation: of whole rows (one block per row), and of each head in place (qwen3's
// q/k norms, one warp per head).

#include "common.cuh"

extern "C" __global__ void rms_norm(const float *x, const float *weight, float eps, int cols,
                                    float *out) {
    __shared__ float scratch[32];
    const float *row = x + (size_t)blockIdx.x * cols;
    float sum = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        sum += row[j] * row[j];
    }
    const float scale = rsqrtf(block_sum(sum, scratch) / cols + eps);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        out[(size_t)blockIdx.x * cols + j] = row[j] * scale * weight[j];
    }
}

// Heads of `head_dim` values, `heads` in all (rows times heads per row); one warp each.
extern "C" __global__ void rms_norm_heads(float *x, const float *weight, float eps, int head_dim,
                                          int heads) {
    const int head = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (head >= heads) {
        return;
    }
    float *h = x + (size_t)head * head_dim;
    float sum = 0.0f;
    for (int j = lane; j < head_dim; j += WARP_SIZE) {
        sum += h[j] * h[j];
    }
    const float scale = rsqrtf(warp_sum(sum) / head_dim + eps);
    for (int j = lane; j < head_dim; j += WARP_SIZE) {
        h[j] = h[j] * scale * weight[j];
    }
}
