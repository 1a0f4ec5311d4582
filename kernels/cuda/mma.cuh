// The f16 tensor-core primitives of the kernels that multiply prompt rows (gemm.cuh,
// prompt_attention.cu): asynchronous copies into shared memory, ldmatrix and the m16n8k16 f16
// mma with f32 accumulators. An mma's accumulator of row r depends on row r of A alone, which
// is what lets those kernels give a row the same bits whatever rows share its tile.
//
// The mma instructions exist from sm_80; HIP builds none of this (crates/backend/build.rs).
#pragma once

#include "common.cuh"

#if !defined(__HIP__)

static __device__ __forceinline__ void cp_async16(void *smem, const void *global, bool valid) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    // A row past the matrix reads nothing and fills zeros (src-size 0).
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global),
                 "r"(valid ? 16 : 0));
}

// Closes this thread's group of cp.async issued since the last one.
static __device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most `PENDING` of this thread's latest groups are still copying.
template <int PENDING> static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

static __device__ __forceinline__ void ldmatrix_x4(unsigned r[4], const __half *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// ldmatrix of four 8x8 matrices stored [k][n], each lane receiving the B fragment of the mma
// (k 2 (lane % 4) and the next, n lane / 4): a row-major tile used as the mma's B without a
// transposed copy.
static __device__ __forceinline__ void ldmatrix_x4_trans(unsigned r[4], const __half *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

static __device__ __forceinline__ void mma_f16(float c[4], const unsigned a[4], unsigned b0,
                                               unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as the f16 pair an mma operand register holds (a in the low half).
static __device__ __forceinline__ unsigned half2_bits(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const unsigned *>(&h);
}

#endif
