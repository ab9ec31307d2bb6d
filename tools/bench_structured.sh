#!/usr/bin/env bash
# Structured output on the Qwen2.5-Coder 1.5B target / 0.5B drafter pair: JSON-schema
# constrained generation, plain vs speculative vs speculative with fast-forward, beside free
# plain decoding and llama-server with the same schemas (tools/bench_structured.py).
#
# Usage: tools/bench_structured.sh [OUT_DIR]
#   OUT_DIR defaults to target/bench_structured/<timestamp> (report.md, results.json, logs).
# Environment: THREADS (default: all cores), REPS (default 3), MAX_TOKENS (default 256),
#   SKIP=llama (no llama-server), SPECD_MODEL_DIR, CARGO_TARGET_DIR.
set -euo pipefail

source "$(dirname "$0")/qwen_pair_bench.sh"
threads=${THREADS:-$(nproc)}
out=${1:-$repo/target/bench_structured/$(date -u +%Y%m%dT%H%M%SZ)}
llama=()
if [[ ",${SKIP:-}," != *,llama,* ]]; then
    llama=(--llama-server "$(llamacpp_bin)/llama-server")
fi
build_release -p specd

mkdir -p "$out"
note_machine "$out" "commit: $(git -C "$repo" rev-parse --short HEAD)"
python3 "$repo/tools/bench_structured.py" --specd "$specd" "${llama[@]}" \
    --target "$target" --drafter "$drafter" --threads "$threads" --out "$out" \
    --reps "${REPS:-3}" --max-tokens "${MAX_TOKENS:-256}"
note_load_after "$out"
echo "bench_structured: results in $out" >&2
