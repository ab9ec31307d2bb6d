#!/usr/bin/env bash
# Overlapped drafting across services on the Qwen2.5-Coder 1.5B target / 0.5B drafter pair:
# the verifier pinned to one core with one thread, the drafter pinned to another core with one
# thread (PLACEMENT=pinned, the default), or both on every core with their default threads as
# a new user starts them (PLACEMENT=shared); and five routers over them: --overlap on (the
# drafter pre-drafts the next round while the verifier verifies, assuming every draft is
# accepted), the same with --predraft-branches (it also pre-drafts the likeliest rejections,
# batched in the same forwards), --overlap off (sequential rounds), --overlap auto (the
# default: pre-drafting while the router measures that it pays) and --draft hybrid with
# --overlap auto (prompt lookup in the router for rounds that copy earlier text). Plain
# decoding runs on the verifier's core alone (speculation switched off per request). Every
# prompt of the built-in code, prose and edit set goes through each mode over the routers'
# OpenAI-compatible HTTP API; decode tokens/s per verifier core come from the router's own
# stats, with the pre-draft hit rates, and every mode's output must be the same text.
# Both processes share one memory bus here, so the figures understate separate machines.
# Beside them, llama.cpp's plain decoding on the verifier's core with one thread (llama-bench
# tg, median of 3, from an empty context), the peer every speed figure is also given against.
#
# Usage: tools/bench_overlap.sh [OUT_DIR]
# Environment: MAX_TOKENS (default 96), BLOCK_SIZES (default 3,4,0; 0: the adaptive policy),
#   BRANCHES (the branched router's --predraft-branches, default 1),
#   PLACEMENT (pinned or shared, default pinned), VERIFIER_CORE (default 0), DRAFTER_CORE
#   (default 1; both pinned only), KINDS (default all), SPECD_MODEL_DIR,
#   CARGO_TARGET_DIR. Needs taskset and python3 (standard library only).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
models=${SPECD_MODEL_DIR:-$HOME/.cache/specd/models}
max_tokens=${MAX_TOKENS:-96}
block_sizes=${BLOCK_SIZES:-3,4,0}
branches=${BRANCHES:-1}
placement=${PLACEMENT:-pinned}
verifier_core=${VERIFIER_CORE:-0}
drafter_core=${DRAFTER_CORE:-1}
threads=(--threads 1)
case $placement in
    pinned) ;;
    shared) verifier_core="" drafter_core="" threads=() ;;
    *) echo "bench_overlap: PLACEMENT must be pinned or shared" >&2; exit 2 ;;
esac
out=${1:-$repo/target/bench_overlap/$(date -u +%Y%m%dT%H%M%SZ)}

target=$models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
drafter=$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
"$repo/tools/fetch_qwen_pair.sh" "$models"
llama_bin=$(LLAMACPP_PROBE_MODEL=${LLAMACPP_PROBE_MODEL:-$target} "$repo/tools/build_llamacpp.sh")
(cd "$repo" && cargo build --release -p specd -p specd-bench)
specd=${CARGO_TARGET_DIR:-$repo/target}/release/specd
specd_bench=${CARGO_TARGET_DIR:-$repo/target}/release/specd-bench
mkdir -p "$out"

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

# Starts `specd serve ARGS...` (after an optional `taskset -c CORE`) and waits for its gRPC
# `listening on` line, whose address it leaves in $addr; its log goes to $out/NAME.log.
start() {
    local name=$1 core=$2
    shift 2
    local log=$out/$name.log
    if [ -n "$core" ]; then
        taskset -c "$core" "$specd" serve "$@" --listen 127.0.0.1:0 >"$log" 2>&1 &
    else
        "$specd" serve "$@" --listen 127.0.0.1:0 >"$log" 2>&1 &
    fi
    pids+=($!)
    for _ in $(seq 1 600); do
        addr=$(sed -n 's/^listening on //p' "$log" | head -1)
        if [ -n "$addr" ]; then return; fi
        sleep 0.5
    done
    echo "bench_overlap: $name did not start; see $log" >&2
    exit 1
}

http_of() { sed -n 's/^http listening on //p' "$out/$1.log" | head -1; }

start verifier "$verifier_core" verifier "${threads[@]}" --target "$target"
verifier=$addr
start drafter "$drafter_core" drafter "${threads[@]}" --drafter "$drafter" --target "$target"
drafter_addr=$addr
for mode in on:0 branched:$branches off:0 auto:$branches hybrid:$branches; do
    name=${mode%%:*}
    overlap=on
    drafting=()
    case $name in
        off | auto) overlap=$name ;;
        hybrid) overlap=auto drafting=(--draft hybrid) ;;
    esac
    start "router-$name" "" router --verifier "http://$verifier" \
        --drafters "http://$drafter_addr" --target "$target" --overlap "$overlap" \
        --predraft-branches "${mode#*:}" --http-listen 127.0.0.1:0 "${drafting[@]}"
done

"$specd_bench" --print-prompts ${KINDS:+--kinds "$KINDS"} >"$out/prompts.tsv"
{
    echo "date: $(date -u)"
    echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
    if [ "$placement" = pinned ]; then
        echo "verifier: core $verifier_core, 1 thread; drafter: core $drafter_core, 1 thread"
    else
        echo "verifier and drafter: every core, default threads"
    fi
    echo "load before: $(uptime)"
} | tee "$out/machine.txt"
if [ "$placement" = pinned ]; then
    taskset -c "$verifier_core" "$llama_bin/llama-bench" -m "$target" -t 1 -r 3 -p 0 \
        -n "$max_tokens" -o json >"$out/llama-bench.json" 2>"$out/llama-bench.log"
else
    "$llama_bin/llama-bench" -m "$target" -t "$(nproc)" -r 3 -p 0 \
        -n "$max_tokens" -o json >"$out/llama-bench.json" 2>"$out/llama-bench.log"
fi
llama_tps=$(python3 -c '
import json, statistics, sys
row = [r for r in json.load(open(sys.argv[1])) if r.get("n_gen")][0]
print(row["n_gen"] / (statistics.median(row["samples_ns"]) / 1e9))' "$out/llama-bench.json")
echo "llama.cpp plain decode (${placement}): $llama_tps tok/s" | tee -a "$out/report.md"
for block in ${block_sizes//,/ }; do
    python3 "$repo/tools/bench_overlap.py" --llama-tps "$llama_tps" \
        --router "overlapped=http://$(http_of router-on)" \
        --router "sequential=http://$(http_of router-off)" \
        --router "branched=http://$(http_of router-branched)" \
        --router "auto=http://$(http_of router-auto)" \
        --router "hybrid=http://$(http_of router-hybrid)" \
        --prompts "$out/prompts.tsv" --max-tokens "$max_tokens" --block-size "$block" \
        --json "$out/block$block.json" | tee -a "$out/report.md"
    echo | tee -a "$out/report.md"
done
echo "load after: $(uptime)" | tee -a "$out/machine.txt"
echo "bench_overlap: results in $out" >&2
