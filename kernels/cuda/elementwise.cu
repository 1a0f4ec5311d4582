// Small row-wise operations: the SwiGLU product, residual adds, and gathering the rows whose
// logits are wanted.

#include "q8.cuh"

// With `quantized.hi` set (n a multiple of 32, and so the grid's stride), the product is also
// quantized for the matvec that takes it: each warp's 32 consecutive values are one group.
extern "C" __global__ void silu_mul(float *gate, const float *up, unsigned long long n,
                                    QuantizedOut quantized) {
    AFTER_PREVIOUS_KERNEL();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        const float v = g / (1.0f + expf(-g)) * up[i];
        gate[i] = v;
        if (quantized.hi != nullptr) {
            quantize_group(v, (long long)(i / WARP_SIZE), quantized);
        }
    }
}

extern "C" __global__ void add(float *x, const float *y, unsigned long long n) {
    AFTER_PREVIOUS_KERNEL();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        x[i] += y[i];
    }
}

// out[i] = x[rows[i]]: one block per gathered row.
extern "C" __global__ void gather_rows(const float *x, const unsigned *rows, int cols,
                                       float *out) {
    AFTER_PREVIOUS_KERNEL();
    const float *src = x + (size_t)rows[blockIdx.x] * cols;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        out[(size_t)blockIdx.x * cols + j] = src[j];
    }
}
