// The few spellings that differ between CUDA and HIP, so that one kernel source builds for both
// (kernels/cuda/*.cu compile as CUDA with nvcc and as HIP with clang or hipcc).
#pragma once

#if defined(__HIP__)
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
// The kernels reduce over 32 lanes. RDNA (gfx10 and later, our gfx1100, gfx1151 and gfx1201)
// runs 32-wide waves by default; a 64-wide build would silently halve every reduction.
#if defined(__AMDGCN_WAVEFRONT_SIZE) && __AMDGCN_WAVEFRONT_SIZE != 32
#error "the kernels need 32-wide waves: build for RDNA without -mwavefrontsize64"
#endif
// HIP's shuffles take no lane mask: every lane of the wave takes part.
#define SHFL_XOR(v, offset) __shfl_xor((v), (offset), 32)
#define SHFL(v, lane) __shfl((v), (lane), 32)
// The sum of the four signed byte products of a and b, plus c (RDNA3 and RDNA4 have it as
// v_dot4_i32_iu8).
#define DP4A(a, b, c) __builtin_amdgcn_sudot4(true, (a), true, (b), (c), false)
#else
#include <cuda_fp16.h>
#define SHFL_XOR(v, offset) __shfl_xor_sync(0xffffffffu, (v), (offset))
#define SHFL(v, lane) __shfl_sync(0xffffffffu, (v), (lane))
#define DP4A(a, b, c) __dp4a((a), (b), (c))
#endif
