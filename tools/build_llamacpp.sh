#!/usr/bin/env bash
# Build llama.cpp, the CPU peer of the benchmarks, from the llama-cpp-python sdist on PyPI
# (which vendors llama.cpp at commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f), into
# ~/.cache/specd/llama.cpp. Nothing from llama.cpp enters the repository.
#
# Usage: tools/build_llamacpp.sh [DIR]
#   DIR defaults to ${SPECD_LLAMACPP_DIR:-$HOME/.cache/specd/llama.cpp}.
# Prints the directory holding the binaries (llama-bench, llama-completion,
# llama-speculative, llama-speculative-simple) on stdout. Idempotent: a finished build is
# reused, an interrupted one resumed.
#
# Needs python3 with pip (only to download the sdist), cmake and a C++ compiler
# (Debian: apt-get install cmake g++).
set -euo pipefail

readonly VERSION=0.3.36
readonly COMMIT=0c1e57098
readonly TARGETS=(llama-bench llama-completion llama-speculative llama-speculative-simple)

log() { echo "build_llamacpp: $*" >&2; }

dir=${1:-${SPECD_LLAMACPP_DIR:-$HOME/.cache/specd/llama.cpp}}
src=$dir/src
tree=$src/llama_cpp_python-$VERSION/vendor/llama.cpp
bin=$tree/build/bin

all_built() {
    local t
    for t in "${TARGETS[@]}"; do
        [ -x "$bin/$t" ] || return 1
    done
}

if all_built; then
    echo "$bin"
    exit 0
fi

for tool in cmake python3 c++; do
    command -v "$tool" >/dev/null || { log "error: $tool not found"; exit 1; }
done

mkdir -p "$src"
sdist=$src/llama_cpp_python-$VERSION.tar.gz
if [ ! -f "$sdist" ]; then
    # Only llama-cpp-python itself comes as source; its build backend comes as wheels, which
    # pip needs just to read the sdist's metadata (nothing is compiled here).
    log "downloading llama-cpp-python $VERSION (sdist)"
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
        -d "$src" "llama-cpp-python==$VERSION"
fi
if [ ! -f "$tree/CMakeLists.txt" ]; then
    log "unpacking $sdist"
    tar xzf "$sdist" -C "$src"
fi

cd "$tree"
log "configuring (Release, native CPU, no CUDA, no network)"
cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DGGML_CUDA=OFF \
    -DLLAMA_BUILD_COMMIT="$COMMIT" -DLLAMA_BUILD_NUMBER=0 >&2
log "building ${TARGETS[*]} (several minutes on 2 cores)"
cmake --build build -j"$(nproc)" --target "${TARGETS[@]}" >&2
all_built || { log "error: a target is missing in $bin"; exit 1; }
echo "$bin"
