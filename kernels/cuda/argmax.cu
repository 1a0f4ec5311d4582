// The index of each row's largest value, exactly as the host's `argmax`: the first one on ties,
// NaN never wins, and 0 when no value exceeds -infinity.

#include "common.cuh"

#define ARGMAX_THREADS 256
// Columns each thread of a block reads, all loads issued before the first comparison.
#define ARGMAX_PER_THREAD 16
// A block's share of a row (ARGMAX_CHUNK in crates/backend/src/gpu/mod.rs).
#define ARGMAX_CHUNK (ARGMAX_THREADS * ARGMAX_PER_THREAD)

// No index: what a share without a value above -infinity reports.
#define NO_INDEX 0xffffffffu

// (value, index) with the larger value winning and the lower index breaking ties. That orders
// any two candidates of a row (their indices differ), so whatever order they are compared in,
// the winner is the row's first maximum.
static __device__ __forceinline__ void better(float *value, unsigned *index, float v,
                                              unsigned i) {
    if (v > *value || (v == *value && i < *index)) {
        *value = v;
        *index = i;
    }
}

// The block's best of each thread's (value, index); every thread gets it.
static __device__ __forceinline__ void block_best(float *value, unsigned *index) {
    __shared__ float values[ARGMAX_THREADS / WARP_SIZE];
    __shared__ unsigned indices[ARGMAX_THREADS / WARP_SIZE];
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        better(value, index, SHFL_XOR(*value, offset), SHFL_XOR(*index, offset));
    }
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    if (lane == 0) {
        values[warp] = *value;
        indices[warp] = *index;
    }
    __syncthreads();
    *value = values[0];
    *index = indices[0];
    for (int w = 1; w < ARGMAX_THREADS / WARP_SIZE; w++) {
        better(value, index, values[w], indices[w]);
    }
}

// Each row is cut into chunks of ARGMAX_CHUNK columns, a block each (block b: row b / chunks,
// chunk b % chunks), so that the 151,936 logits of a Qwen row are read by 38 SMs, not one
// block's 593 turns. Each block writes its chunk's best to `chunk_values` and `chunk_indices`;
// the last block of a row to arrive (counted in `arrivals`, which it sets back to 0) takes the
// best of the chunks' and writes the row's index to `out`.
extern "C" __global__ void argmax_rows(const float *x, int cols, int chunks, float *chunk_values,
                                       unsigned *chunk_indices, unsigned *arrivals,
                                       unsigned *out) {
    __shared__ unsigned arrived;
    AFTER_PREVIOUS_KERNEL();
    const int r = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
    const float *row = x + (size_t)r * cols;
    const int first = chunk * ARGMAX_CHUNK + threadIdx.x;
    float v[ARGMAX_PER_THREAD];
#pragma unroll
    for (int i = 0; i < ARGMAX_PER_THREAD; i++) {
        const int j = first + i * ARGMAX_THREADS;
        v[i] = j < cols ? row[j] : -INFINITY;
    }
    // Ascending and strictly greater: the thread's first maximum of its columns.
    float best = -INFINITY;
    unsigned index = NO_INDEX;
#pragma unroll
    for (int i = 0; i < ARGMAX_PER_THREAD; i++) {
        if (v[i] > best) {
            best = v[i];
            index = first + i * ARGMAX_THREADS;
        }
    }
    block_best(&best, &index);
    const size_t at = (size_t)r * chunks;
    if (threadIdx.x == 0) {
        chunk_values[at + chunk] = best;
        chunk_indices[at + chunk] = index;
        // The chunk's result is visible to every block before its arrival counts.
        __threadfence();
        arrived = atomicAdd(&arrivals[r], 1u);
    }
    __syncthreads();
    if (arrived != (unsigned)chunks - 1) {
        return;
    }
    __threadfence();
    best = -INFINITY;
    index = NO_INDEX;
    // Read past this SM's cache: other blocks wrote them.
    for (int c = threadIdx.x; c < chunks; c += ARGMAX_THREADS) {
        better(&best, &index, ((const volatile float *)chunk_values)[at + c],
               ((const volatile unsigned *)chunk_indices)[at + c]);
    }
    block_best(&best, &index);
    if (threadIdx.x == 0) {
        arrivals[r] = 0;
        out[r] = index == NO_INDEX ? 0 : index;
    }
}
