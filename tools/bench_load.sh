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

source "$(dirname "$0")/qwen_pair_bench.sh"
out=${1:-$repo/target/bench_load/$(date -u +%Y%m%dT%H%M%SZ)}
# llama.cpp is built only when llama-server runs (SKIP=llama leaves it out).
llama_server=none
if [[ ",${SKIP:-}," != *,llama,* ]]; then
    llama_server=$(llamacpp_bin)/llama-server
fi
build_release -p specd -p specd-bench
specd=${SPECD_BIN:-$specd}

mkdir -p "$out"
"$specd_bench" --print-prompts >"$out/prompts.tsv"
note_machine "$out"
python3 "$repo/tools/bench_load.py" --specd "$specd" --llama-server "$llama_server" \
    --target "$target" --drafter "$drafter" --prompts "$out/prompts.tsv" --out "$out" \
    --levels "${LEVELS:-1,4,8,16}" --requests "${REQUESTS:-2}" \
    --max-tokens "${MAX_TOKENS:-64}" --block-size "${BLOCK_SIZE:-0}" \
    ${THREADS:+--threads "$THREADS"} ${SKIP:+--skip "$SKIP"} ${PIN:+--pin}
note_load_after "$out"
echo "bench_load: results in $out" >&2
