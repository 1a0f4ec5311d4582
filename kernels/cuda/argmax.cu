// The index of each row's largest value, exactly as the host's `argmax`: the first one on ties,
// NaN never wins, and 0 when no value exceeds -infinity.

#include "common.cuh"

#define ARGMAX_THREADS 256

// (value, index) with the larger value winning and the lower index breaking ties.
static __device__ __forceinline__ void better(float *value, unsigned *index, float v,
                                              unsigned i) {
    if (v > *value || (v == *value && i < *index)) {
        *value = v;
        *index = i;
    }
}

extern "C" __global__ void argmax_rows(const float *x, int cols, unsigned *out) {
    __shared__ float values[ARGMAX_THREADS];
    __shared__ unsigned indices[ARGMAX_THREADS];
    AFTER_PREVIOUS_KERNEL();
    const float *row = x + (size_t)blockIdx.x * cols;
    float best = -INFINITY;
    unsigned index = 0xffffffffu;
    // Ascending and strictly greater: each thread keeps the first maximum of its share.
    for (int j = threadIdx.x; j < cols; j += ARGMAX_THREADS) {
        if (row[j] > best) {
            best = row[j];
            index = j;
        }
    }
    values[threadIdx.x] = best;
    indices[threadIdx.x] = index;
    __syncthreads();
    for (int stride = ARGMAX_THREADS / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            float v = values[threadIdx.x];
            unsigned i = indices[threadIdx.x];
            better(&v, &i, values[threadIdx.x + stride], indices[threadIdx.x + stride]);
            values[threadIdx.x] = v;
            indices[threadIdx.x] = i;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[blockIdx.x] = indices[0] == 0xffffffffu ? 0 : indices[0];
    }
}
