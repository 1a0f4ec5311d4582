# shellcheck shell=bash
# The llama.cpp build shared by tests/bench/compare-llama-cpp and tests/bench/compare-spec:
# sourced (after `set -euo pipefail`), not run.
#
# llama.cpp comes from the llama-cpp-python sdist on PyPI (pinned version and sha256), is unpacked
# and built once under ${XDG_CACHE_HOME:-~/.cache}/lucebox/llama.cpp (CPU only, Release,
# GGML_NATIVE=ON), never inside the repository. Environment:
#   LLAMA_CPP_SRC    an unpacked llama.cpp source tree to use instead of downloading the sdist
#   LLAMA_CPP_BUILD  build directory (default <cache>/build-<version>)
#   LLAMA_CPP_AMX    1 to keep ggml's AMX kernels (default: compiled out, see below)
#   LLAMA_CPP_JOBS   parallel jobs of the build (default: nproc)
#
# GGML_NATIVE=ON enables AMX on CPUs that advertise it, but ggml's AMX matmul kernels die with
# SIGILL (tilezero) on the Sapphire Rapids VM (Firecracker) this project is measured on, though a
# standalone ldtilecfg/tilezero test runs there. Without AMX llama.cpp still uses its AVX-512
# VNNI kernels and the CPU weight repacking.
#
# Defines say, die, ensure_tools, fetch_source and build_llama_cpp, and sets cache_root,
# llama_cache and build_dir.

LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/lucebox
llama_cache=$cache_root/llama.cpp
build_dir=${LLAMA_CPP_BUILD:-$llama_cache/build-$LLAMA_CPP_PYTHON_VERSION}

say() { echo "${0##*/}: $*" >&2; }
die() { say "error: $*"; exit 1; }

ensure_tools() {
    local missing=()
    for tool in cmake make g++ curl python3; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    ((${#missing[@]} == 0)) && return
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
    local sudo=()
    ((EUID == 0)) || sudo=(sudo)
    say "installing ${missing[*]} with apt-get"
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
}

# The sdist's URL from PyPI's simple index; its sha256 must match the pin.
fetch_source() {
    local name=llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION
    local unpacked=$llama_cache/$name/vendor/llama.cpp
    if [[ -f $unpacked/CMakeLists.txt ]]; then
        echo "$unpacked"
        return
    fi
    mkdir -p "$llama_cache"
    local url
    url=$(curl -fsS https://pypi.org/simple/llama-cpp-python/ |
        grep -o "https://[^\"#]*/$name\.tar\.gz" | head -n 1) ||
        die "no $name.tar.gz in PyPI's index for llama-cpp-python"
    say "downloading $url"
    curl -fsSL -o "$llama_cache/$name.tar.gz.part" "$url"
    echo "$LLAMA_CPP_PYTHON_SHA256  $llama_cache/$name.tar.gz.part" | sha256sum --check --status ||
        die "$name.tar.gz does not have the pinned sha256 $LLAMA_CPP_PYTHON_SHA256"
    mv "$llama_cache/$name.tar.gz.part" "$llama_cache/$name.tar.gz"
    tar -xzf "$llama_cache/$name.tar.gz" -C "$llama_cache"
    echo "$unpacked"
}

# build_llama_cpp [--examples] [--server] TARGET...: configures and builds llama.cpp in
# $build_dir unless every TARGET is already there as $build_dir/bin/TARGET. --examples
# configures llama.cpp's examples too (llama-speculative-simple is one), --server its HTTP server
# (llama-server); reconfiguring an existing build directory only adds targets, the libraries
# already built stay.
build_llama_cpp() {
    local examples=OFF server=OFF
    while [[ ${1:-} == --examples || ${1:-} == --server ]]; do
        [[ $1 == --examples ]] && examples=ON
        [[ $1 == --server ]] && server=ON
        shift
    done
    local target stale=0
    for target in "$@"; do
        [[ -x $build_dir/bin/$target ]] || stale=1
    done
    ((stale)) || return 0
    ensure_tools
    local src=${LLAMA_CPP_SRC:-}
    [[ -n $src ]] || src=$(fetch_source)
    [[ -f $src/CMakeLists.txt ]] || die "$src is not a llama.cpp source tree"
    local isa_flags=""
    if [[ $(uname -m) == x86_64 && ${LLAMA_CPP_AMX:-0} != 1 ]]; then
        isa_flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    fi
    mkdir -p "$build_dir"
    say "building llama.cpp from $src in $build_dir (takes a while)"
    cmake -S "$src" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
        -DCMAKE_C_FLAGS="$isa_flags" -DCMAKE_CXX_FLAGS="$isa_flags" \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES="$examples" \
        -DLLAMA_BUILD_SERVER="$server" -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=ON \
        >"$build_dir.configure.log" 2>&1 || die "cmake configure failed: see $build_dir.configure.log"
    nice cmake --build "$build_dir" --config Release -j "${LLAMA_CPP_JOBS:-$(nproc)}" --target "$@" \
        >"$build_dir.build.log" 2>&1 || die "llama.cpp build failed: see $build_dir.build.log"
}
