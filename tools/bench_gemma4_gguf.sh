#!/usr/bin/env bash
# specd's Gemma 4 path beside llama.cpp on the same Gemma 4 GGUF file (a medium random target),
# in one run: costs only (random weights, so no acceptance figures).
#
# Usage: tools/bench_gemma4_gguf.sh [OUT_DIR]        (default /tmp/gemma4-medium-gguf)
#   THREADS=2   threads on both sides (llama.cpp -t, SPECD_THREADS, RAYON_NUM_THREADS)
#   TYPES="f32 f16 q8_0"   GGUF types converted and measured
#   CONTEXT=128 tokens already in the cache before the decode/verify steps
#   GEN=64      tokens generated per specd run (decode step = median of 3 runs)
#   REPS=5      llama-bench repetitions
#
# What it does (each step skipped when its output exists):
#  1. builds the medium random checkpoint of tools/bench_torch_gemma4.py, but with 4 KV-shared
#     layers instead of 2 (see below why), in /tmp/gemma4-medium-kv4 (or $SPECD_BENCH_GEMMA4_DIR),
#     with the torch/transformers of ~/.cache/specd/venv-gguf;
#  2. converts it with llama.cpp's convert_hf_to_gguf.py to OUT_DIR/gemma4-medium-TYPE.gguf,
#     through a copy that carries a stub tokenizer of exactly vocab_size tokens (as
#     tools/gemma4_gguf_fixtures.sh does: special tokens, byte tokens, then filler tokens, and
#     one merge, since llama.cpp's gemma4 (BPE) vocabulary refuses a file without merges).
#     Both sides are fed token ids, so the tokenizer is never used;
#  3. llama.cpp from tools/build_llamacpp.sh (probed with the f32 file, so a build whose AMX path
#     crashes on batches is replaced by the one without AMX);
#  4. llama-bench, THREADS threads: tg (decode step, empty context and at depth CONTEXT), pp of
#     n = 1..8 tokens at depth CONTEXT (verify-sized batches; llama-bench takes logits for the
#     last token only), pp CONTEXT (prefill); mean of REPS repetitions;
#  5. specd (target/release/specd, built if absent): `specd generate --target FILE.gguf
#     --prompt-ids <CONTEXT ids> --no-draft --ignore-eos --max-tokens GEN --json`, 3 runs, the
#     median decode ms/token (decode time over the tokens after the first);
#  6. specd's verify of n tokens (n = 1..8) on a CONTEXT-token cache, for each GGUF type: the
#     gemma4_forward bench (crates/models/benches) on OUT_DIR/gemma4-medium-TYPE.gguf; median of
#     REPS runs, with and without the logits of the n rows, and its 128-token prefill. That
#     bench's context is fixed at 128 tokens: leave CONTEXT at 128 to compare like with like.
# Then prints a table with the ratios specd / llama.cpp, and leaves the raw outputs in OUT_DIR.
set -euo pipefail

log() { echo "bench_gemma4_gguf: $*" >&2; }

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-/tmp/gemma4-medium-gguf}
ckpt=${SPECD_BENCH_GEMMA4_DIR:-/tmp/gemma4-medium-kv4}
threads=${THREADS:-2}
types=${TYPES:-f32 f16 q8_0}
context=${CONTEXT:-128}
gen=${GEN:-64}
reps=${REPS:-5}
venv=${SPECD_GGUF_VENV:-$HOME/.cache/specd/venv-gguf}
py=$venv/bin/python
source "$root/tools/llamacpp_source.sh"
tree=$(llamacpp_tree "${SPECD_LLAMACPP_DIR:-$HOME/.cache/specd/llama.cpp}/src")
mkdir -p "$out"

# 1. the checkpoint
if [ ! -f "$ckpt/config.json" ]; then
    [ -x "$py" ] || "$root/tools/gemma4_gguf_fixtures.sh" "$(mktemp -d)"   # makes the venv
    log "building the medium random checkpoint in $ckpt"
    (cd "$root/tools" && "$py" - "$ckpt" <<'EOF'
import sys
from pathlib import Path
import torch, transformers
torch.set_grad_enabled(False)
transformers.logging.set_verbosity_error()
import bench_torch_gemma4, hf_gemma4_workarounds
hf_gemma4_workarounds.install()
# llama.cpp (llama-kv-cache reuse in llama-model.cpp) makes a KV-shared layer read layer
# n_kv_from_start - 1 (full) or - 2 (sliding): the last non-shared layers must be sliding, full,
# as in the published checkpoints. The medium layout S S S F S S S F with 2 shared layers ends
# its non-shared layers with S S (llama.cpp aborts on a GGML_ASSERT); 4 shared layers end them
# with S F, which both read the way transformers does.
bench_torch_gemma4.MEDIUM_CONFIG["num_kv_shared_layers"] = 4
bench_torch_gemma4.build(Path(sys.argv[1]))
EOF
    )
fi

# 2. the GGUF files
for t in $types; do
    gguf=$out/gemma4-medium-$t.gguf
    [ -f "$gguf" ] && continue
    log "converting $ckpt to $gguf"
    llamacpp_convert "$py" "$tree" "$ckpt" gemma4-medium "$t" "$gguf" "$out/convert-$t.log" \
        --loadable || exit 1
done

# 3. llama.cpp
bin=$(LLAMACPP_PROBE_MODEL=$out/gemma4-medium-f32.gguf "$root/tools/build_llamacpp.sh")
log "llama.cpp binaries: $bin"

# 4. llama-bench
for t in $types; do
    gguf=$out/gemma4-medium-$t.gguf
    n_list=$(seq -s, 1 8)
    log "llama-bench $t: tg, pp 1..8 at depth $context, pp $context"
    {
        "$bin/llama-bench" -m "$gguf" -t "$threads" -r "$reps" -o jsonl -p 0 -n "$gen" -d "0,$context"
        "$bin/llama-bench" -m "$gguf" -t "$threads" -r "$reps" -o jsonl -p "$n_list" -n 0 -d "$context"
        "$bin/llama-bench" -m "$gguf" -t "$threads" -r "$reps" -o jsonl -p "$context" -n 0
    } >"$out/llama-bench-$t.jsonl" 2>"$out/llama-bench-$t.log"
done

# 5. specd decode
specd=$root/target/release/specd
if [ ! -x "$specd" ]; then
    log "building specd (release)"
    (cd "$root" && cargo build --release -p specd --bin specd)
fi
ids=$(python3 -c "
import sys
n, vocab, x = int(sys.argv[1]), 32768, 7
out = [2]
while len(out) < n:
    x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
    out.append(3 + (x >> 33) % (vocab - 3))
print(','.join(map(str, out)))" "$context")
for t in $types; do
    : >"$out/specd-$t.jsonl"
    for run in 1 2 3; do
        log "specd generate $t, run $run"
        SPECD_THREADS=$threads RAYON_NUM_THREADS=$threads "$specd" generate \
            --target "$out/gemma4-medium-$t.gguf" --prompt-ids "$ids" --no-draft --ignore-eos \
            --max-tokens "$gen" --json >>"$out/specd-$t.jsonl" 2>>"$out/specd-$t.log"
        echo >>"$out/specd-$t.jsonl"
    done
done

# 6. specd verify of n tokens (the block forward) and prefill, on each GGUF file
for t in $types; do
    log "specd verify blocks $t (cargo bench gemma4_forward)"
    (cd "$root" && SPECD_BENCH_GEMMA4_DIR=$out/gemma4-medium-$t.gguf SPECD_BENCH_RUNS=$reps \
        SPECD_THREADS=$threads RAYON_NUM_THREADS=$threads \
        cargo bench -q -p specd-models --bench gemma4_forward) \
        >"$out/specd-blocks-$t.json" 2>"$out/specd-blocks-$t.log" \
        || { tail -20 "$out/specd-blocks-$t.log" >&2; exit 1; }
done

python3 - "$out" "$context" "$gen" "$types" <<'PY'
import json, statistics, sys
from pathlib import Path

out, context, gen, types = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
rows = []
def row(what, specd, llama):
    ratio = specd / llama if specd and llama else float("nan")
    rows.append((what, specd, llama, ratio))
for t in types:
    bench = [json.loads(l) for l in (out / f"llama-bench-{t}.jsonl").read_text().splitlines() if l.strip()]
    def llama_ms(p, n, d):
        for b in bench:
            if (b["n_prompt"], b["n_gen"], b["n_depth"]) == (p, n, d):
                return b["avg_ns"] / 1e6 / max(p, n)
        return None
    runs = [json.loads(l) for l in (out / f"specd-{t}.jsonl").read_text().splitlines() if l.strip()]
    decode = statistics.median(r["speed"]["decode_seconds"] / r["speed"]["decode_tokens"] * 1e3 for r in runs)
    row(f"{t}: decode step, ms/token (specd: {gen} tokens after {context}; llama: tg{gen} @ d{context})",
        decode, llama_ms(0, gen, context))
    row(f"{t}: decode step, ms/token (llama: tg{gen} @ d0)", None, llama_ms(0, gen, 0))
    blocks = json.loads((out / f"specd-blocks-{t}.json").read_text())
    for n in range(1, 9):
        b = blocks["block_on_context"]["by_block_size"].get(str(n))
        llama = llama_ms(n, 0, context)
        llama = llama * n if llama else None
        what = f"verify forward, {n} logits rows" if b else "not measured by specd"
        row(f"{t}: block of {n} @ d{context}, ms (specd: {what})", b["median_ms"] if b else None, llama)
        if b:
            row(f"{t}: block of {n} @ d{context}, ms (specd: hidden states, no logits)",
                b["hidden_only_ms"], llama)
    p = llama_ms(context, 0, 0)
    row(f"{t}: prefill of {context} tokens, ms", blocks["prefill"]["median_ms"], p * context if p else None)
def fmt(x):
    return "-" if x is None else f"{x:.2f}"
width = max(len(r[0]) for r in rows)
print(f"| {'measurement'.ljust(width)} | specd | llama.cpp | specd / llama.cpp |")
print(f"|{'-' * (width + 2)}|---:|---:|---:|")
for what, s, l, r in rows:
    print(f"| {what.ljust(width)} | {fmt(s)} | {fmt(l)} | {'-' if s is None or l is None else f'{r:.2f}x'} |")
PY
