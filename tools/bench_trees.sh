#!/usr/bin/env bash
# Token trees against chains on the real Qwen2.5-Coder 1.5B / 0.5B pair, embedded, per prompt
# kind (specd-bench's built-in code, prose and edit prompts): plain, the default chains and
# trees, and a chain and a tree of equal verify width, each output checked against plain.
#
# Usage: tools/bench_trees.sh [OUT_DIR]
# Environment: MAX_TOKENS (default 128), REPS (default 3), KINDS (e.g. prose,code; default
#   all), DRAFT (draft-model, hybrid or ngram; default draft-model), SPECD_MODEL_DIR,
#   CARGO_TARGET_DIR.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
models=${SPECD_MODEL_DIR:-$HOME/.cache/specd/models}
out=${1:-$repo/target/bench_trees/$(date -u +%Y%m%dT%H%M%SZ)}

"$repo/tools/fetch_qwen_pair.sh" "$models"
(cd "$repo" && cargo build --release -p specd -p specd-bench)
bin=${CARGO_TARGET_DIR:-$repo/target}/release
mkdir -p "$out"
{
    echo "date: $(date -u)"
    echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
    echo "load before: $(uptime)"
} | tee "$out/machine.txt"
python3 "$repo/tools/bench_trees.py" --specd "$bin/specd" --specd-bench "$bin/specd-bench" \
    --target "$models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" \
    --drafter "$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" \
    --max-tokens "${MAX_TOKENS:-128}" --reps "${REPS:-3}" --kinds "${KINDS:-}" \
    --draft "${DRAFT:-draft-model}" --out "$out"
echo "load after: $(uptime)" | tee -a "$out/machine.txt"
echo "bench_trees: results in $out" >&2
