#!/bin/sh
# Builds tests/quant/llama-kernels against a llama.cpp CPU build.
#   LLAMA_SRC:   llama.cpp sources (default: the llama-cpp-python sdist's vendor/llama.cpp)
#   LLAMA_BUILD: its cmake build directory, with bin/libggml-cpu.so (default: /work/ext/llama-build)
#   OUT:         the binary to write (default: ./llama-kernels)
set -eu
here=$(dirname "$0")
src=${LLAMA_SRC:-/work/ext/llama-cpp-python/vendor/llama.cpp}
build=${LLAMA_BUILD:-/work/ext/llama-build}
out=${OUT:-./llama-kernels}
g++ -O2 -std=c++17 -I"$src/ggml/include" "$here/llama-kernels.cpp" \
    -L"$build/bin" -lggml-cpu -lggml-base -Wl,-rpath,"$build/bin" -o "$out"
