#!/usr/bin/env bash
# specd and llama.cpp side by side on the Qwen2.5-Coder 1.5B target / 0.5B drafter pair, in one
# run: specd plain and speculative (draft-model and n-gram, K = 1..6 drafts per round) and
# llama.cpp plain, speculative (the same draft model and K) and prompt lookup (llama-lookup,
# the same K, on the edit prompts), same prompts, same number of new tokens, greedy; every
# figure also per prompt kind (code, prose, edit). Then the engines themselves: specd-bench's engine section (memory read
# bandwidth, decode step and the share of that bandwidth it uses, verify of 1..8 tokens, draft
# step, prefill of a 1,500-token prompt on both models and the decode step after it) against
# llama-bench (tg32 from an empty context and after 1,500 tokens, pp1..8 and pp1500 on the
# target; both tg32 and pp1500 on the drafter), and the cold start to the first token
# of a fresh `specd generate` and `llama-completion` process (median of 3, with peak RSS).
# Prints a markdown report (tokens/s, ratios, acceptance, step costs, whether each tool's
# speculative output equals its plain output, the same per prompt kind, llama-lookup beside
# specd's n-gram drafter, and the "Engine" table, each figure beside its target).
#
# Usage: tools/bench_pair.sh [OUT_DIR]
#   OUT_DIR defaults to target/bench_pair/<timestamp>; it receives report.md, specd.json,
#   llama.json, cold_start.json and every raw log.
# Environment: MAX_TOKENS (default 40), KS (default 1,2,3,4,5,6), THREADS (default: all
#   cores; llama.cpp's -t and SPECD_THREADS of every specd process), PROMPTS (a file, one
#   prompt a line, `KIND<TAB>TEXT` to give it a kind; default: specd-bench's built-in code,
#   prose and edit prompts), KINDS (the prompt kinds to run, e.g. code,edit; default: all),
#   LOOKUP_KINDS (the kinds llama-lookup runs on, or all; default: edit), SPECD_MODEL_DIR,
#   SPECD_LLAMACPP_DIR, CARGO_TARGET_DIR.
#
# Fetches the pair (tools/fetch_qwen_pair.sh) and builds llama.cpp (tools/build_llamacpp.sh)
# and specd and specd-bench (release) when needed. Needs python3 for the driver (tools/bench_pair.py).
set -euo pipefail

source "$(dirname "$0")/qwen_pair_bench.sh"
max_tokens=${MAX_TOKENS:-40}
ks=${KS:-1,2,3,4,5,6}
threads=${THREADS:-$(nproc)}
out=${1:-$repo/target/bench_pair/$(date -u +%Y%m%dT%H%M%SZ)}
llama_bin=$(llamacpp_bin)
build_release -p specd -p specd-bench

mkdir -p "$out"
note_machine "$out"
python3 "$repo/tools/bench_pair.py" --specd "$specd" --specd-bench "$specd_bench" --llama-bin "$llama_bin" \
    --target "$target" --drafter "$drafter" \
    --max-tokens "$max_tokens" --ks "$ks" --threads "$threads" --out "$out" \
    ${PROMPTS:+--prompts "$PROMPTS"} ${KINDS:+--kinds "$KINDS"} \
    ${LOOKUP_KINDS:+--lookup-kinds "$LOOKUP_KINDS"}
note_load_after "$out"
echo "bench_pair: results in $out" >&2
