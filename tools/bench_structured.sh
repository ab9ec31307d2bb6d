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

repo=$(cd "$(dirname "$0")/.." && pwd)
models=${SPECD_MODEL_DIR:-$HOME/.cache/specd/models}
threads=${THREADS:-$(nproc)}
out=${1:-$repo/target/bench_structured/$(date -u +%Y%m%dT%H%M%SZ)}
target=$models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
drafter=$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf

"$repo/tools/fetch_qwen_pair.sh" "$models"
llama=()
if [[ ",${SKIP:-}," != *,llama,* ]]; then
    llama_bin=$(LLAMACPP_PROBE_MODEL=${LLAMACPP_PROBE_MODEL:-$target} "$repo/tools/build_llamacpp.sh")
    llama=(--llama-server "$llama_bin/llama-server")
fi
(cd "$repo" && cargo build --release -p specd)
specd=${CARGO_TARGET_DIR:-$repo/target}/release/specd

mkdir -p "$out"
{
    echo "date: $(date -u)"
    echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
    echo "commit: $(git -C "$repo" rev-parse --short HEAD)"
    echo "load before: $(uptime)"
} | tee "$out/machine.txt"
python3 "$repo/tools/bench_structured.py" --specd "$specd" "${llama[@]}" \
    --target "$target" --drafter "$drafter" --threads "$threads" --out "$out" \
    --reps "${REPS:-3}" --max-tokens "${MAX_TOKENS:-256}"
echo "load after: $(uptime)" | tee -a "$out/machine.txt"
echo "bench_structured: results in $out" >&2
