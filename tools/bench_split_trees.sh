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

repo=$(cd "$(dirname "$0")/.." && pwd)
models=${SPECD_MODEL_DIR:-$HOME/.cache/specd/models}
out=${1:-$repo/target/bench_split_trees/$(date -u +%Y%m%dT%H%M%SZ)}
target=$models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
drafter=$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
"$repo/tools/fetch_qwen_pair.sh" "$models"
(cd "$repo" && cargo build --release -p specd -p specd-bench)
bin=${CARGO_TARGET_DIR:-$repo/target}/release
mkdir -p "$out"

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

# start NAME ARGS...: `specd serve ARGS` on a free port; its log names the address.
start() {
    local name=$1
    shift
    "$bin/specd" serve "$@" --listen 127.0.0.1:0 >"$out/$name.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 600); do
        addr=$(sed -n 's/^listening on //p' "$out/$name.log" | head -1)
        [ -n "$addr" ] && return
        sleep 0.5
    done
    echo "bench_split_trees: $name did not start; see $out/$name.log" >&2
    exit 1
}
http_of() { sed -n 's/^http listening on //p' "$out/$1.log" | head -1; }

start verifier verifier --target "$target"
verifier=$addr
start drafter drafter --drafter "$drafter" --target "$target"
drafter_addr=$addr
for nodes in 3 0; do
    start "router-trees$nodes" router --verifier "http://$verifier" \
        --drafters "http://$drafter_addr" --target "$target" --tree-nodes "$nodes" \
        --http-listen 127.0.0.1:0
done

"$bin/specd-bench" --print-prompts ${KINDS:+--kinds "$KINDS"} >"$out/prompts.tsv"
{
    echo "date: $(date -u)"
    echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
    echo "verifier, drafter and routers co-located with their defaults"
    echo "load before: $(uptime)"
} | tee "$out/machine.txt"
for block in $(echo "${BLOCK_SIZES:-0}" | tr , ' '); do
    python3 "$repo/tools/bench_overlap.py" \
        --router "trees=http://$(http_of router-trees3)" \
        --router "chains=http://$(http_of router-trees0)" \
        --prompts "$out/prompts.tsv" --max-tokens "${MAX_TOKENS:-128}" \
        --block-size "$block" --runs "${RUNS:-2}" --json "$out/block$block.json" |
        tee -a "$out/report.md"
    echo | tee -a "$out/report.md"
done
echo "load after: $(uptime)" | tee -a "$out/machine.txt"
echo "bench_split_trees: results in $out" >&2
