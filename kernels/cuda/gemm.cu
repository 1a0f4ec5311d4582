// The instances of gemm.cuh the backend launches for prompt rows where the host profile asks for
// it (`prompt_gemm`): a dequantizer to f16 per format (run before each GEMM), the f32 to f16
// conversion of activation rows, and the GEMM for each tile shape, which tests/cuda/gemm/bench.cu
// times.

#include "gemm.cuh"

#if !defined(__HIP__)

#define DEQUANTIZE_INSTANCE(name, Block)                                                       \
    extern "C" __global__ void dequantize_f16_##name(const uint8_t *w,                         \
                                                     unsigned long long row_bytes, int rows,   \
                                                     int cols, __half *out) {                  \
        dequantize_f16<Block>(w, row_bytes, rows, cols, out);                                  \
    }
FOR_EACH_FORMAT(DEQUANTIZE_INSTANCE)

extern "C" __global__ void activations_to_f16(const float *x, long long n, __half *out) {
    to_f16(x, n, out);
}

#define GEMM_INSTANCE(BM, BN)                                                                  \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS)                                 \
        gemm_f16_##BM##x##BN(const __half *x, const __half *w, const float *bias, int m, int n, \
                             int k, float *out) {                                              \
        gemm_f16<BM, BN>(x, w, bias, m, n, k, out);                                            \
    }
GEMM_INSTANCE(64, 64)
GEMM_INSTANCE(64, 128)
GEMM_INSTANCE(128, 64)
GEMM_INSTANCE(128, 128)

#endif
