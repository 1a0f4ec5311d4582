// RMS normalisation: of whole rows (one block per row, optionally after the residual add), and
// of each head in place (qwen3's q/k norms, one warp per head).

#include "q8.cuh"

#define NORM_WARPS 32
#define NORM_THREADS (NORM_WARPS * WARP_SIZE)
// The widest row: each thread keeps its columns in registers between the two passes.
#define NORM_MAX_PER_THREAD 8
#define NORM_MAX_COLS (NORM_THREADS * NORM_MAX_PER_THREAD)

// One block of NORM_THREADS threads per row of at most NORM_MAX_COLS columns (the caller
// checks). With `y`, the row first becomes x + y, written back to x: the residual add that ends
// a sublayer, fused with the norm that starts the next. Thread i takes columns i,
// i + NORM_THREADS, ... and keeps them in registers; its loads are all issued before the first
// is used, and its weights' before the previous kernel ends, so a row costs about one memory
// round trip, a block-wide sum and the writes. The warps' sums of squares are added in a fixed
// order, so a row's result does not depend on the batch. With `quantized.hi` set (cols a
// multiple of 32), the output is also quantized for the matvec that takes it: warp w holds
// groups w, w + NORM_WARPS, ... of 32 columns.
extern "C" __global__ void rms_norm(float *x, const float *y, const float *weight, float eps,
                                    int cols, float *out, QuantizedOut quantized) {
    __shared__ float partial[NORM_WARPS];
    START_NEXT_KERNEL();
    // The thread's weights, which no kernel writes, are on their way while the kernel before
    // finishes, instead of one more round trip to memory after the sum.
    float w[NORM_MAX_PER_THREAD];
#pragma unroll
    for (int i = 0; i < NORM_MAX_PER_THREAD; i++) {
        const int j = threadIdx.x + i * NORM_THREADS;
        w[i] = j < cols ? weight[j] : 0.0f;
    }
    WAIT_FOR_PREVIOUS_KERNEL();
    const long long r = blockIdx.x;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    float *row = x + r * cols;
    float v[NORM_MAX_PER_THREAD];
#pragma unroll
    for (int i = 0; i < NORM_MAX_PER_THREAD; i++) {
        const int j = threadIdx.x + i * NORM_THREADS;
        v[i] = j < cols ? row[j] : 0.0f;
        if (y != nullptr && j < cols) {
            v[i] += y[r * cols + j];
        }
    }
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < NORM_MAX_PER_THREAD; i++) {
        const int j = threadIdx.x + i * NORM_THREADS;
        if (y != nullptr && j < cols) {
            row[j] = v[i];
        }
        sum += v[i] * v[i];
    }
    sum = warp_sum(sum);
    if (lane == 0) {
        partial[warp] = sum;
    }
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < NORM_WARPS; w++) {
        total += partial[w];
    }
    const float scale = rsqrtf(total / cols + eps);
    const int groups = (cols + WARP_SIZE - 1) / WARP_SIZE;
#pragma unroll
    for (int i = 0; i < NORM_MAX_PER_THREAD; i++) {
        const int g = warp + i * NORM_WARPS;
        if (g >= groups) {
            break;
        }
        // Column j = g * 32 + lane is this thread's threadIdx.x + i * NORM_THREADS.
        const int j = g * WARP_SIZE + lane;
        const float normed = j < cols ? v[i] * scale * w[i] : 0.0f;
        if (j < cols) {
            out[r * cols + j] = normed;
        }
        if (quantized.hi != nullptr) {
            quantize_group(normed, r * groups + g, quantized);
        }
    }
}

// Heads of `head_dim` values, `heads` in all (rows times heads per row); one warp each.
extern "C" __global__ void rms_norm_heads(float *x, const float *weight, float eps, int head_dim,
                                          int heads) {
    AFTER_PREVIOUS_KERNEL();
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
