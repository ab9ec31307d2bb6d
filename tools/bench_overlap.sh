#!/usr/bin/env bash
# Overlapped drafting across services on the Qwen2.5-Coder 1.5B target / 0.5B drafter pair:
# the verifier pinned to one core with one thread, the drafter pinned to another core with one
# thread (PLACEMENT=pinned, the default), or both on every core with their default threads as
# a new user starts them (PLACEMENT=shared); and five routers over them: --overlap on (the
# drafter pre-drafts the next round while the verifier verifies, assuming every draft is
# accepted), the same with --predraft-branches (it also pre-drafts the likeliest rejections,
# batched in the same forwards), --overlap off (sequential rounds) and --overlap auto
# (pre-drafting while the router measures that it pays), all four drafting with the services
# alone (--draft drafters), and the router's defaults, --draft hybrid with --overlap auto
# (prompt lookup in the router for rounds that copy earlier text). Plain
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

source "$(dirname "$0")/qwen_pair_bench.sh"
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
llama_bin=$(llamacpp_bin)
build_release -p specd -p specd-bench
mkdir -p "$out"

start_service verifier "$verifier_core" verifier "${threads[@]}" --target "$target"
verifier=$addr
start_service drafter "$drafter_core" drafter "${threads[@]}" --drafter "$drafter" --target "$target"
drafter_addr=$addr
for mode in on:0 branched:$branches off:0 auto:$branches hybrid:$branches; do
    name=${mode%%:*}
    overlap=on
    # Every router but the hybrid one drafts with the services alone (--draft drafters), so
    # the columns compare overlap modes and the hybrid column adds the lookup front alone.
    drafting=(--draft drafters)
    case $name in
        off | auto) overlap=$name ;;
        hybrid) overlap=auto drafting=(--draft hybrid) ;;
    esac
    start_service "router-$name" "" router --verifier "http://$verifier" \
        --drafters "http://$drafter_addr" --target "$target" --overlap "$overlap" \
        --predraft-branches "${mode#*:}" --http-listen 127.0.0.1:0 "${drafting[@]}"
done

"$specd_bench" --print-prompts ${KINDS:+--kinds "$KINDS"} >"$out/prompts.tsv"
if [ "$placement" = pinned ]; then
    placed="verifier: core $verifier_core, 1 thread; drafter: core $drafter_core, 1 thread"
else
    placed="verifier and drafter: every core, default threads"
fi
note_machine "$out" "$placed"
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
note_load_after "$out"
echo "bench_overlap: results in $out" >&2
