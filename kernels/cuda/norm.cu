// RMS normalisation: of whole rows (one block per row), and of each head in place (qwen3's
// q/k norms, one warp per head).

#include "q8.cuh"

// One warp per 32 columns of a row (blocks of warps, `groups` = ceil(cols / 32) per row): each
// warp sums the squares of the whole row itself, in the same order as the row's other warps, so
// no warp waits on another. With `quantized.hi` set (cols a multiple of 32), the output is also
// quantized for the matvec that takes it.
extern "C" __global__ void rms_norm(const float *x, const float *weight, float eps, int cols,
                                    int groups, long long items, float *out,
                                    QuantizedOut quantized) {
    const long long item = (long long)blockIdx.x * (blockDim.x / WARP_SIZE) +
                           threadIdx.x / WARP_SIZE;
    if (item >= items) {
        return;
    }
    const long long r = item / groups;
    const int g = (int)(item % groups), lane = threadIdx.x % WARP_SIZE;
    const float *row = x + r * cols;
    float sum = 0.0f;
#pragma unroll 8
    for (int j = lane; j < cols; j += WARP_SIZE) {
        sum += row[j] * row[j];
    }
    const float scale = rsqrtf(warp_sum(sum) / cols + eps);
    const int j = g * WARP_SIZE + lane;
    const float v = j < cols ? row[j] * scale * weight[j] : 0.0f;
    if (j < cols) {
        out[r * cols + j] = v;
    }
    if (quantized.hi != nullptr) {
        quantize_group(v, item, quantized);
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
