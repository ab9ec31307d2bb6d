#!/usr/bin/env bash
# Token trees against chains on the real Qwen2.5-Coder 1.5B / 0.5B pair, embedded, per prompt
# kind (specd-bench's built-in code, prose and edit prompts): plain, the default chains and
# trees, and a chain and a tree of equal verify width, each output checked against plain.
#
# Usage: tools/bench_trees.sh [OUT_DIR]
# Environment: MAX_TOKENS (default 128), REPS (default 3), KINDS (e.g. prose,code; default
#   all), DRAFT (draft-model, hybrid or ngram; default draft-model), MODES (trees, or
#   draft-weights: the draft model as stored against at 4 bits), SPECD_MODEL_DIR,
#   CARGO_TARGET_DIR.
set -euo pipefail

source "$(dirname "$0")/qwen_pair_bench.sh"
out=${1:-$repo/target/bench_trees/$(date -u +%Y%m%dT%H%M%SZ)}
build_release -p specd -p specd-bench
mkdir -p "$out"
note_machine "$out"
python3 "$repo/tools/bench_trees.py" --specd "$specd" --specd-bench "$specd_bench" \
    --target "$target" --drafter "$drafter" \
    --max-tokens "${MAX_TOKENS:-128}" --reps "${REPS:-3}" --kinds "${KINDS:-}" \
    --draft "${DRAFT:-draft-model}" --modes "${MODES:-trees}" --out "$out"
note_load_after "$out"
echo "bench_trees: results in $out" >&2
