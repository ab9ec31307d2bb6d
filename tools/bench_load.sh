#!/usr/bin/env bash
# Speculation under load beside llama-server: aggregate throughput at 1, 4, 8 and 16
# concurrent clients on the Qwen2.5-Coder 1.5B target / 0.5B drafter pair, llama-server
# with as many parallel slots (-np N), specd split into three processes and specd's
# one-process server, each plain and with its defaults (see tools/bench_load.py).
#
# Usage: tools/bench_load.sh [OUT_DIR]
#   OUT_DIR defaults to target/bench_load/<timestamp>; it receives report.md, results.json
#   and every server's log.
# Environment: LEVELS (default 1,4,8,16), REQUESTS (per client, default 2), MAX_TOKENS
#   (default 64), BLOCK_SIZE (a fixed block size for speculative requests, which the
#   governor then leaves alone; default 0: specd decides), THREADS (every server's threads;
#   default: their own defaults), PIN=1 (split services pinned: verifier on core 0, drafter
#   on core 1, one thread each), SKIP (llama, split, one-process), SPECD_BIN (a specd
#   binary to use instead of building one), SPECD_MODEL_DIR, SPECD_LLAMACPP_DIR,
#   CARGO_TARGET_DIR.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
models=${SPECD_MODEL_DIR:-$HOME/.cache/specd/models}
out=${1:-$repo/target/bench_load/$(date -u +%Y%m%dT%H%M%SZ)}

target=$models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
drafter=$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf

"$repo/tools/fetch_qwen_pair.sh" "$models"
llama_bin=$(LLAMACPP_PROBE_MODEL=${LLAMACPP_PROBE_MODEL:-$target} "$repo/tools/build_llamacpp.sh")
(cd "$repo" && cargo build --release -p specd -p specd-bench)
specd=${SPECD_BIN:-${CARGO_TARGET_DIR:-$repo/target}/release/specd}
specd_bench=${CARGO_TARGET_DIR:-$repo/target}/release/specd-bench

mkdir -p "$out"
"$specd_bench" --print-prompts >"$out/prompts.tsv"
{
    echo "date: $(date -u)"
    echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
    echo "load before: $(uptime)"
} | tee "$out/machine.txt"
python3 "$repo/tools/bench_load.py" --specd "$specd" --llama-server "$llama_bin/llama-server" \
    --target "$target" --drafter "$drafter" --prompts "$out/prompts.tsv" --out "$out" \
    --levels "${LEVELS:-1,4,8,16}" --requests "${REQUESTS:-2}" \
    --max-tokens "${MAX_TOKENS:-64}" --block-size "${BLOCK_SIZE:-0}" \
    ${THREADS:+--threads "$THREADS"} ${SKIP:+--skip "$SKIP"} ${PIN:+--pin}
echo "load after: $(uptime)" | tee -a "$out/machine.txt"
echo "bench_load: results in $out" >&2
