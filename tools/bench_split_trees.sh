#!/usr/bin/env bash
# Token trees across the split services on the real Qwen2.5-Coder 1.5B / 0.5B pair: one
# verifier and one draft-model drafter as `specd serve` processes co-located with their
# defaults, and two routers, one verifying trees (--tree-nodes 3, the default) and one chains
# only (--tree-nodes 0), measured through the routers' HTTP API by bench_overlap.py on
# specd-bench's built-in prompts: decode tokens/s, trees ÷ chains, each ÷ plain, and whether
# every output is the same.
#
# Usage: tools/bench_split_trees.sh [OUT_DIR]
# Environment: MAX_TOKENS (default 128), BLOCK_SIZES (default 0 = adaptive; e.g. 0,4), RUNS
#   (default 2), KINDS (e.g. prose,code), SPECD_MODEL_DIR, CARGO_TARGET_DIR.
set -euo pipefail

source "$(dirname "$0")/qwen_pair_bench.sh"
out=${1:-$repo/target/bench_split_trees/$(date -u +%Y%m%dT%H%M%SZ)}
build_release -p specd -p specd-bench
mkdir -p "$out"

start_service verifier "" verifier --target "$target"
verifier=$addr
start_service drafter "" drafter --drafter "$drafter" --target "$target"
drafter_addr=$addr
for nodes in 3 0; do
    start_service "router-trees$nodes" "" router --verifier "http://$verifier" \
        --drafters "http://$drafter_addr" --target "$target" --tree-nodes "$nodes" \
        --http-listen 127.0.0.1:0
done

"$specd_bench" --print-prompts ${KINDS:+--kinds "$KINDS"} >"$out/prompts.tsv"
note_machine "$out" "verifier, drafter and routers co-located with their defaults"
for block in $(echo "${BLOCK_SIZES:-0}" | tr , ' '); do
    python3 "$repo/tools/bench_overlap.py" \
        --router "trees=http://$(http_of router-trees3)" \
        --router "chains=http://$(http_of router-trees0)" \
        --prompts "$out/prompts.tsv" --max-tokens "${MAX_TOKENS:-128}" \
        --block-size "$block" --runs "${RUNS:-2}" --json "$out/block$block.json" |
        tee -a "$out/report.md"
    echo | tee -a "$out/report.md"
done
note_load_after "$out"
echo "bench_split_trees: results in $out" >&2
