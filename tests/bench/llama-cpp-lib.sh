# shellcheck shell=bash
# The llama.cpp build shared by tests/bench/compare-llama-cpp and tests/bench/compare-spec:
# sourced (after `set -euo pipefail`), not run.
#
# llama.cpp comes from the llama-cpp-python sdist on PyPI (pinned version and sha256), is unpacked
# and built once under ${XDG_CACHE_HOME:-~/.cache}/lucebox/llama.cpp (Release, GGML_NATIVE=ON,
# CPU only unless LLAMA_CPP_CUDA_ARCHS is set), never inside the repository. Builds are
# serialised by a lock beside the build directory, so a script may wait for one started in the
# background. Environment:
#   LLAMA_CPP_SRC    an unpacked llama.cpp source tree to use instead of downloading the sdist
#   LLAMA_CPP_BUILD  build directory (default <cache>/build-<version>, -cuda<archs> with CUDA)
#   LLAMA_CPP_CUDA_ARCHS  build ggml's CUDA backend too, for these architectures (CMake's
#                    CUDA_ARCHITECTURES: 90, or 86;120), with nvcc from the PATH
#   LLAMA_CPP_AMX    1 to keep ggml's AMX kernels (default: compiled out, see below)
#   LLAMA_CPP_JOBS   parallel jobs of the build (default: nproc)
#
# GGML_NATIVE=ON enables AMX on CPUs that advertise it, but ggml's AMX matmul kernels die with
# SIGILL (tilezero) on the Sapphire Rapids VM (Firecracker) this project is measured on, though a
# standalone ldtilecfg/tilezero test runs there. Without AMX llama.cpp still uses its AVX-512
# VNNI kernels and the CPU weight repacking.
#
# Defines say, die, ensure_tools, fetch_source, use_device and build_llama_cpp, and sets
# cache_root, llama_cache and build_dir.

LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/lucebox
llama_cache=$cache_root/llama.cpp
cuda_archs=${LLAMA_CPP_CUDA_ARCHS:-}
build_dir=${LLAMA_CPP_BUILD:-$llama_cache/build-$LLAMA_CPP_PYTHON_VERSION${cuda_archs:+-cuda${cuda_archs//;/-}}}

say() { echo "${0##*/}: $*" >&2; }
die() { say "error: $*"; exit 1; }

# ensure_tools TOOL...: installs the missing ones with apt-get, or fails naming them.
ensure_tools() {
    local missing=()
    for tool in "$@"; do
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
    ensure_tools curl
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

# use_device DEVICE: where llama.cpp runs, cpu or cuda. Sets llama_device, the offload flags of
# llama.cpp's programs, and for cuda the architectures (LLAMA_CPP_CUDA_ARCHS, else the first
# GPU's from nvidia-smi) and the build directory that goes with them.
use_device() {
    llama_device=()
    case $1 in
    cpu) ;;
    cuda)
        llama_device=(-ngl 99)
        if [[ -z $cuda_archs ]]; then
            cuda_archs=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .) ||
                die "DEVICE=cuda: nvidia-smi does not name the GPU's architecture; set LLAMA_CPP_CUDA_ARCHS"
            build_dir=${LLAMA_CPP_BUILD:-$build_dir-cuda$cuda_archs}
        fi
        ;;
    *) die "DEVICE=$1: cpu or cuda" ;;
    esac
}

# built TARGET...: whether every TARGET is in $build_dir/bin.
built() {
    local target
    for target in "$@"; do
        [[ -x $build_dir/bin/$target ]] || return 1
    done
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
    built "$@" && return 0
    mkdir -p "$(dirname "$build_dir")"
    local lock
    exec {lock}>"$build_dir.lock"
    flock "$lock"
    if built "$@"; then
        exec {lock}>&-
        return 0
    fi
    # ninja where make is missing (the lent GPU machine has CMake and ninja from PyPI).
    local generator=()
    if ! command -v make >/dev/null && command -v ninja >/dev/null; then
        generator=(-G Ninja)
    fi
    ensure_tools cmake g++ python3
    ((${#generator[@]})) || ensure_tools make
    local cuda=(-DGGML_CUDA=OFF)
    if [[ -n $cuda_archs ]]; then
        command -v nvcc >/dev/null || die "LLAMA_CPP_CUDA_ARCHS is set but nvcc is not on the PATH"
        cuda=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$cuda_archs")
    fi
    local src=${LLAMA_CPP_SRC:-}
    [[ -n $src ]] || src=$(fetch_source)
    [[ -f $src/CMakeLists.txt ]] || die "$src is not a llama.cpp source tree"
    local isa_flags=""
    if [[ $(uname -m) == x86_64 && ${LLAMA_CPP_AMX:-0} != 1 ]]; then
        isa_flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    fi
    mkdir -p "$build_dir"
    say "building llama.cpp from $src in $build_dir (takes a while)"
    cmake -S "$src" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON "${cuda[@]}" \
        -DCMAKE_C_FLAGS="$isa_flags" -DCMAKE_CXX_FLAGS="$isa_flags" \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES="$examples" \
        -DLLAMA_BUILD_SERVER="$server" -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=ON \
        >"$build_dir.configure.log" 2>&1 || die "cmake configure failed: see $build_dir.configure.log"
    nice cmake --build "$build_dir" --config Release -j "${LLAMA_CPP_JOBS:-$(nproc)}" --target "$@" \
        >"$build_dir.build.log" 2>&1 || die "llama.cpp build failed: see $build_dir.build.log"
    exec {lock}>&-
}
