// The standalone CUDA benches' (tests/cuda/*/bench.cu) way out of a failed runtime call: the
// call's place and the runtime's message, then exit.
#pragma once

#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                                           \
    do {                                                                                      \
        cudaError_t e = (call);                                                               \
        if (e != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e));         \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)
