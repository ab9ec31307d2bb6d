#!/usr/bin/env bash
# The demo: fetch the real Qwen2.5-Coder 1.5B (target) / 0.5B (drafter) GGUF pair if absent,
# then generate in embedded mode with speculative decoding, streaming the text and ending with
# the speculative stats line.
#
# Usage: tools/demo.sh ["PROMPT"] [extra specd generate flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
models="${SPECD_MODEL_DIR:-$HOME/.cache/specd/models}"
bash tools/fetch_qwen_pair.sh "$models"
prompt="${1:-Write a Python function that checks whether a string is a palindrome.}"
shift || true
exec cargo run --release -q -p specd -- generate \
  --target "$models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" \
  --draft draft-model --drafter "$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" \
  --max-tokens 128 --prompt "$prompt" "$@"
