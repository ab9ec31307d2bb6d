#!/usr/bin/env bash
# Multi-turn chats, agent loops and concurrent conversations: specd (one-process server with
# and without its prefix cache, and split into three services) beside llama-server, on the
# Qwen2.5-Coder 1.5B target / 0.5B drafter pair, every server asked the same messages over
# its OpenAI API with streaming (see tools/bench_multiturn.py for the scenarios).
#
# Usage: tools/bench_multiturn.sh [OUT_DIR]
#   OUT_DIR defaults to target/bench_multiturn/<timestamp>; it receives report.md,
#   results.json and every server's log.
# Environment: THREADS (default: all cores; llama-server's -t and SPECD_THREADS of every specd
#   process), SKIP (scenarios to leave out, comma-separated: chat, agent, load, split),
#   SPECD_MODEL_DIR, SPECD_LLAMACPP_DIR, CARGO_TARGET_DIR.
#
# Fetches the pair (tools/fetch_qwen_pair.sh) and builds llama.cpp (tools/build_llamacpp.sh)
# and specd (release) when needed.
set -euo pipefail

source "$(dirname "$0")/qwen_pair_bench.sh"
threads=${THREADS:-$(nproc)}
out=${1:-$repo/target/bench_multiturn/$(date -u +%Y%m%dT%H%M%SZ)}
llama_bin=$(llamacpp_bin)
build_release -p specd

mkdir -p "$out"
note_machine "$out"
python3 "$repo/tools/bench_multiturn.py" --specd "$specd" --llama-server "$llama_bin/llama-server" \
    --target "$target" --drafter "$drafter" --threads "$threads" --out "$out" \
    ${SKIP:+--skip "$SKIP"}
note_load_after "$out"
echo "bench_multiturn: results in $out" >&2
