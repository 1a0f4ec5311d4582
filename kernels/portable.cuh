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
#define SHFL_UP(v, delta) __shfl_up((v), (delta), 32)
// The lanes whose predicate holds, as a 32-bit mask (a 32-wide wave's half of HIP's 64 bits).
#define BALLOT(predicate) ((unsigned)__ballot(predicate))
// The sum of the four signed byte products of a and b, plus c (RDNA3 and RDNA4 have it as
// v_dot4_i32_iu8).
#define DP4A(a, b, c) __builtin_amdgcn_sudot4(true, (a), true, (b), (c), false)
// Ends the kernel with an error its launch reports.
#define TRAP() __builtin_trap()
#else
#include <cuda_fp16.h>
#define SHFL_XOR(v, offset) __shfl_xor_sync(0xffffffffu, (v), (offset))
#define SHFL(v, lane) __shfl_sync(0xffffffffu, (v), (lane))
#define SHFL_UP(v, delta) __shfl_up_sync(0xffffffffu, (v), (delta))
#define BALLOT(predicate) __ballot_sync(0xffffffffu, (predicate))
#define DP4A(a, b, c) __dp4a((a), (b), (c))
#define TRAP() __trap()
#endif

// Programmatic dependent launch (CUDA, sm_90 and later; crates/backend/src/cuda.rs): a kernel
// may start while the one before it in the stream is still running, so that its blocks are
// resident, and its weights on their way from memory, when that one ends. Every kernel
// therefore lets the next one start, then waits for the previous one to finish (and its writes
// to be visible) before it reads anything an earlier kernel wrote or writes anything at all;
// before the wait it may only read what no kernel writes: the weights, and the batch's
// description (positions, block tables, rotary tables), which the host copies in before a
// pass. Elsewhere (HIP, older NVIDIA architectures) launches are serialised as usual and these
// are no-ops.
#if !defined(__HIP__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define START_NEXT_KERNEL() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#define WAIT_FOR_PREVIOUS_KERNEL() asm volatile("griddepcontrol.wait;" ::: "memory")
// Asks for the 128-byte line at p to be brought into L2, without waiting for it.
#define PREFETCH_L2(p) asm volatile("prefetch.global.L2 [%0];" ::"l"(p))
#else
#define START_NEXT_KERNEL() ((void)0)
#define WAIT_FOR_PREVIOUS_KERNEL() ((void)0)
#define PREFETCH_L2(p) ((void)(p))
#endif
// The start of every kernel that prefetches nothing.
#define AFTER_PREVIOUS_KERNEL()     \
    do {                            \
        START_NEXT_KERNEL();        \
        WAIT_FOR_PREVIOUS_KERNEL(); \
    } while (0)
