#!/usr/bin/env bash
# Gemma 4 target cost, candle (specd) beside transformers (torch CPU f32) in one run, on the
# same medium random checkpoint.
#
# Usage: tools/bench_gemma4.sh [CHECKPOINT_DIR]   (default /tmp/gemma4-medium)
# Needs the Python environment of tools/README.md (torch + transformers 5.23).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-/tmp/gemma4-medium}"
python="${PYTHON:-python3}"
torch_json="$(mktemp)"
trap 'rm -f "$torch_json"' EXIT
"$python" tools/bench_torch_gemma4.py "$dir" --runs "${RUNS:-5}" --threads "$(nproc)" > "$torch_json"
SPECD_BENCH_GEMMA4_DIR="$dir" SPECD_BENCH_TORCH_JSON="$torch_json" SPECD_BENCH_RUNS="${RUNS:-5}" \
  cargo bench -p specd-models --bench gemma4_forward
