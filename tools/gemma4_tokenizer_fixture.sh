#!/usr/bin/env bash
# The Gemma 4-style tokenizer fixture of crates/text: a small SPM-style BPE tokenizer, its GGUF
# written by llama.cpp's converter (tokenizer.ggml.model = gemma4) and reference encodings from
# llama.cpp's llama-tokenize and Hugging Face tokenizers (see gemma4_tokenizer_fixture.py).
#
# Usage: tools/gemma4_tokenizer_fixture.sh [OUT_DIR]
#   OUT_DIR defaults to crates/text/tests/fixtures.
# Needs llama.cpp's source and llama-tokenize (tools/build_llamacpp.sh builds it, a few
# minutes the first time) and the converter's virtual environment
# ${SPECD_GGUF_VENV:-~/.cache/specd/venv-gguf} (as tools/gemma4_gguf_fixtures.sh makes it),
# with tokenizers and jinja2, which transformers brings.
set -euo pipefail

source "$(dirname "$0")/llamacpp_source.sh"

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/crates/text/tests/fixtures}
src=${SPECD_LLAMACPP_DIR:-$HOME/.cache/specd/llama.cpp}/src
venv=${SPECD_GGUF_VENV:-$HOME/.cache/specd/venv-gguf}

tree=$(llamacpp_tree "$src")
bin=$("$root/tools/build_llamacpp.sh")
py=$venv/bin/python
"$py" -c 'import torch, transformers, tokenizers, jinja2' 2>/dev/null || {
    echo "gemma4_tokenizer_fixture: $venv lacks the converter's packages; run tools/gemma4_gguf_fixtures.sh once" >&2
    exit 1
}
"$py" "$root/tools/gemma4_tokenizer_fixture.py" "$tree" "$bin/llama-tokenize" "$out"
