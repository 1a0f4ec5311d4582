// Quantizes activations for the matvec (q8.cuh), for a matvec input that no other kernel
// quantized as it wrote it.

#include "q8.cuh"

// One warp per group of 32 values; `groups` = rows * cols / 32 (cols a multiple of 32).
extern "C" __global__ void quantize_q8(const float *x, long long groups, QuantizedOut out) {
    AFTER_PREVIOUS_KERNEL();
    const long long group = (long long)blockIdx.x * (blockDim.x / WARP_SIZE) +
                            threadIdx.x / WARP_SIZE;
    if (group >= groups) {
        return;
    }
    quantize_group(x[group * WARP_SIZE + threadIdx.x % WARP_SIZE], group, out);
}
