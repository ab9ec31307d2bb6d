#!/usr/bin/env bash
# GGUF copies of the tiny Gemma 4 targets and of their dense-head assistants, made by
# llama.cpp's own converter (convert_hf_to_gguf.py, F32), for the tests of specd's Gemma 4 GGUF
# loaders.
#
# Usage: tools/gemma4_gguf_fixtures.sh [OUT_DIR]
#   OUT_DIR defaults to crates/models/tests/fixtures/gemma4-gguf.
# Writes target-nople-f32.gguf, target-full-f32.gguf and target-moe-f32.gguf (mixture of
# experts), and assistant-dense-f32.gguf and assistant-moe-f32.gguf (architecture
# gemma4-assistant, the assistants paired with target-full and target-moe), from the
# checkpoints of the same name under crates/models/tests/fixtures/gemma4/, which must exist
# (tools/gemma4_fixtures.py). assistant-centroid is left out: the converter drops its centroid
# head (every masked_embedding tensor, with no metadata in its place), so its GGUF is a
# dense-head assistant that transformers never runs.
#
# The converter is the one vendored in the llama-cpp-python 0.3.36 sdist that
# tools/build_llamacpp.sh builds from (llama.cpp commit 0c1e57098): it is downloaded and
# unpacked into ${SPECD_LLAMACPP_DIR:-~/.cache/specd/llama.cpp}/src if absent (nothing is
# compiled). It runs in the virtual environment ${SPECD_GGUF_VENV:-~/.cache/specd/venv-gguf},
# made with torch and transformers at the versions the fixtures were made with when they do
# not import there (several GB: torch's default wheel pulls in CUDA libraries).
#
# The fixtures carry no tokenizer, and the converter insists on one (Gemma 4 reads
# tokenizer.json through transformers' AutoTokenizer, and sizes token_embd by it). Each
# checkpoint is therefore converted from a temporary copy with the smallest tokenizer the
# converter takes: a byte-fallback BPE of exactly vocab_size tokens (<pad>, <eos>, <bos>,
# <unk>, then byte tokens) and no merges, so no embedding row is dropped. It is not a usable
# tokenizer; the tests feed token ids.
set -euo pipefail

source "$(dirname "$0")/llamacpp_source.sh"
readonly TORCH=2.15.0
readonly TRANSFORMERS=5.23.0

log() { echo "gemma4_gguf_fixtures: $*" >&2; }

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/crates/models/tests/fixtures/gemma4-gguf}
fixtures=$root/crates/models/tests/fixtures/gemma4
src=${SPECD_LLAMACPP_DIR:-$HOME/.cache/specd/llama.cpp}/src
venv=${SPECD_GGUF_VENV:-$HOME/.cache/specd/venv-gguf}

tree=$(llamacpp_tree "$src")

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py=$venv/bin/python
# gguf-py comes from the llama.cpp tree (PYTHONPATH below); these are its and the converter's
# imports.
if ! "$py" -c 'import torch, transformers, numpy, yaml, tqdm, requests' 2>/dev/null; then
    log "installing torch $TORCH and transformers $TRANSFORMERS into $venv"
    "$py" -m pip install --quiet "torch==$TORCH" "transformers==$TRANSFORMERS" numpy \
        safetensors pyyaml tqdm requests
fi

mkdir -p "$out"
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

for name in target-nople target-full target-moe assistant-dense assistant-moe; do
    log "converting $name"
    llamacpp_convert "$py" "$tree" "$fixtures/$name" "$name" f32 "$out/$name-f32.gguf" \
        "$logs/$name.log" || exit 1
done
# Q8_0 copies of the dense and the mixture-of-experts target, for the CPU engine's quantized
# path (target-full-q8_0.gguf, target-moe-q8_0.gguf): the converter keeps the matrices whose
# rows are not whole 32-value blocks in F16, and norms and the router in F32.
for name in target-full target-moe; do
    log "converting $name to Q8_0"
    llamacpp_convert "$py" "$tree" "$fixtures/$name" "$name" q8_0 "$out/$name-q8_0.gguf" \
        "$logs/$name-q8_0.log" || exit 1
done
ls -l "$out"/*.gguf >&2
