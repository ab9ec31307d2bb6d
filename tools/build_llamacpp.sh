#!/usr/bin/env bash
# Build llama.cpp, the CPU peer of the benchmarks, from the llama-cpp-python sdist on PyPI
# (which vendors llama.cpp at commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f), into
# ~/.cache/specd/llama.cpp. Nothing from llama.cpp enters the repository.
#
# Usage: tools/build_llamacpp.sh [DIR]
#   DIR defaults to ${SPECD_LLAMACPP_DIR:-$HOME/.cache/specd/llama.cpp}.
# Prints the directory holding the binaries (llama-bench, llama-completion,
# llama-speculative, llama-speculative-simple, llama-lookup, llama-tokenize, llama-server) on
# stdout. Idempotent: a finished
# build is reused, an interrupted one resumed, and a build that lacks a target (one made
# before that target was added here) builds only the missing one.
#
# With LLAMACPP_PROBE_MODEL=FILE.gguf, the native build must also run a 4-token batch of
# that model: on some machines (seen on a Xeon with AMX under KVM) ggml's AMX matmul
# crashes on every batch of two or more tokens, and then a second build with AMX left out
# (build-noamx, everything else native) is used instead; a line on stderr says so.
#
# Needs python3 with pip (only to download the sdist), cmake and a C++ compiler
# (Debian: apt-get install cmake g++).
set -euo pipefail

source "$(dirname "$0")/llamacpp_source.sh"
readonly COMMIT=0c1e57098
# llama-lookup is llama.cpp's prompt-lookup decoding (examples/lookup): n-gram drafts from the
# prompt and the text so far, no draft model. llama-tokenize gives the reference encodings of
# the Gemma 4 tokenizer fixture (gemma4_tokenizer_fixture.sh). llama-server is the serving peer
# of the multi-turn benchmark (its slot keeps a conversation's K/V between requests).
readonly TARGETS=(llama-bench llama-completion llama-speculative llama-speculative-simple
    llama-lookup llama-tokenize llama-server)

log() { echo "build_llamacpp: $*" >&2; }

dir=${1:-${SPECD_LLAMACPP_DIR:-$HOME/.cache/specd/llama.cpp}}
src=$dir/src
tree=$src/llama_cpp_python-$LLAMACPP_PYTHON_VERSION/vendor/llama.cpp
bin=$tree/build/bin

all_built() {
    local t
    for t in "${TARGETS[@]}"; do
        [ -x "$1/$t" ] || return 1
    done
}

# Whether the binaries in $1 run a small batch of the probe model (always true without one).
batches_run() {
    [ -z "${LLAMACPP_PROBE_MODEL:-}" ] && return 0
    "$1/llama-bench" -m "$LLAMACPP_PROBE_MODEL" -t 2 -r 1 -p 4 -n 0 >/dev/null 2>&1
}

# Builds the targets into $1 with extra C/C++ flags $2.
build() {
    log "configuring $1 (Release, native CPU${2:+, $2}, no CUDA, no network)"
    cmake -B "$1" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DGGML_CUDA=OFF \
        -DCMAKE_C_FLAGS="$2" -DCMAKE_CXX_FLAGS="$2" \
        -DLLAMA_BUILD_COMMIT="$COMMIT" -DLLAMA_BUILD_NUMBER=0 >&2
    log "building ${TARGETS[*]} (several minutes on 2 cores)"
    cmake --build "$1" -j"$(nproc)" --target "${TARGETS[@]}" >&2
    all_built "$1/bin" || { log "error: a target is missing in $1/bin"; exit 1; }
}

noamx=$tree/build-noamx/bin
if all_built "$bin" && batches_run "$bin"; then
    echo "$bin"
    exit 0
fi
if all_built "$noamx" && batches_run "$noamx"; then
    log "using the build without AMX (the native build's batches crash here)"
    echo "$noamx"
    exit 0
fi

for tool in cmake python3 c++; do
    command -v "$tool" >/dev/null || { log "error: $tool not found"; exit 1; }
done

llamacpp_tree "$src" >/dev/null

# GCC gives explicit -mno-* flags precedence over -march=native, whatever their order.
readonly NOAMX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

use_noamx() {
    build build-noamx "$NOAMX_FLAGS"
    batches_run "$noamx" || { log "error: the build without AMX crashes too"; exit 1; }
    log "using the build without AMX"
    echo "$noamx"
    exit 0
}

cd "$tree"
# A build without AMX exists only because the native one crashed here before: when the native
# binaries still crash, only the build without AMX gets the missing targets.
if [ -d build-noamx ] && [ -x "$bin/llama-bench" ] && ! batches_run "$bin"; then
    log "the native build crashes on a 4-token batch of $LLAMACPP_PROBE_MODEL; completing the build without AMX"
    use_noamx
fi
all_built "$bin" || build build ""
if batches_run "$bin"; then
    echo "$bin"
    exit 0
fi
log "the native build crashes on a 4-token batch of $LLAMACPP_PROBE_MODEL; building without AMX"
use_noamx
