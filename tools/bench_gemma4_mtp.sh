#!/usr/bin/env bash
# specd's Gemma 4 MTP draft step and whole round beside llama.cpp's, on the same GGUF pair:
# the medium random target of tools/bench_gemma4_gguf.sh and a medium random assistant (MTP
# drafter) built for it.
# Costs only (random weights: no draft is ever accepted).
#
# Usage: tools/bench_gemma4_mtp.sh [OUT_DIR]        (default /tmp/gemma4-medium-gguf)
#   THREADS=2      threads on both sides (llama.cpp -t/-td, SPECD_THREADS, RAYON_NUM_THREADS)
#   PAIRS="f32:f32 q8_0:f32 q8_0:q8_0"   TARGET_TYPE:ASSISTANT_TYPE of the GGUF pairs measured
#                  (a pair specd cannot load is run by llama.cpp alone, specd's column shows "-")
#   DRAFT=3        draft length K (tokens per draft block)
#   GEN=64         tokens llama.cpp generates per run (one draft block per round)
#   RUNS=9         samples per median of specd's bench
#   ROUNDS=2       rounds, each running both sides in turn (llama.cpp first)
#
# What it does (each build step skipped when its output exists):
#  1. needs the medium target: the checkpoint /tmp/gemma4-medium-kv4 (or
#     $SPECD_BENCH_GEMMA4_DIR) and OUT_DIR/gemma4-medium-TYPE.gguf for each target type of
#     PAIRS, which tools/bench_gemma4_gguf.sh makes (`TYPES="f32 q8_0"
#     tools/bench_gemma4_gguf.sh` builds both; this script stops if they are missing);
#  2. builds the assistant checkpoint in /tmp/gemma4-medium-assistant (or
#     $SPECD_BENCH_GEMMA4_ASSISTANT_DIR) with transformers (~/.cache/specd/venv-gguf): the
#     geometry of the gemma4_assistant bench (crates/models/benches: hidden 256, MLP 1024,
#     4 layers S F S F, 4 query heads; K/V heads, head dims, window and RoPE the target's),
#     dense tied head (the converter drops a centroid head), the seeded random weights of
#     tools/gemma4_random_weights.py;
#  3. converts it with llama.cpp's convert_hf_to_gguf.py (stub tokenizer, as for the target)
#     to OUT_DIR/gemma4-medium-assistant-TYPE.gguf for each assistant type of PAIRS;
#  4. llama.cpp: llama-speculative-simple -m TARGET.gguf -md ASSISTANT.gguf --spec-type
#     draft-mtp --spec-draft-n-max K --spec-draft-n-min 0 --spec-draft-p-min 0 on a
#     128-token prompt (BOS and 127 byte tokens), -n GEN, greedy; its draft statistics (trace log level) give the time
#     spent in the MTP drafter's draft() calls and the tokens drafted: ms per draft token =
#     draft time / drafted tokens. Each draft() call is K assistant decodes of one token
#     (each followed by its top-10 sampling), the first on the target's last verify hidden;
#  5. specd: the gemma4_assistant bench (crates/models/benches) with SPECD_BENCH_GEMMA4_DIR
#     = TARGET.gguf and SPECD_BENCH_GEMMA4_ASSISTANT = ASSISTANT.gguf: draft blocks of K
#     greedy steps (Gemma4Assistant::draft_greedy) after a 128-token target prefill, each
#     timed right after an untimed target verify forward of K + 1 tokens (as llama.cpp's
#     follow its verify batch), median of RUNS; ms per draft token = block / K. The bench's
#     back-to-back figure (blocks in a row, no verify between) is printed beside it;
#  6. the whole round on both sides: llama.cpp's run above reports its decode time over the
#     tokens it decoded, one per round since nothing is accepted (a round: verify of K + 1
#     tokens with their logits, sampling, K draft steps); specd runs the same pair through its
#     round loop, `specd generate --target TARGET.gguf --drafter ASSISTANT.gguf --draft mtp
#     --block-size K+1 --prompt DIGITS --raw-prompt --max-tokens GEN --ignore-eos --json`
#     (target/release/specd, built if absent), decode time over the tokens after the first.
# Prints a table of both, per round, with the ratio specd / llama.cpp; raw outputs stay in
# OUT_DIR (mtp-llama-TARGET-ASSISTANT-kK-rN.log, mtp-specd-TARGET-ASSISTANT-kK-rN.json,
# mtp-round-TARGET-ASSISTANT-kK-rN.json).
set -euo pipefail

log() { echo "bench_gemma4_mtp: $*" >&2; }

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-/tmp/gemma4-medium-gguf}
ckpt=${SPECD_BENCH_GEMMA4_DIR:-/tmp/gemma4-medium-kv4}
assistant=${SPECD_BENCH_GEMMA4_ASSISTANT_DIR:-/tmp/gemma4-medium-assistant}
threads=${THREADS:-2}
pairs=${PAIRS:-f32:f32 q8_0:f32 q8_0:q8_0}
target_types=$(for p in $pairs; do echo "${p%%:*}"; done | sort -u)
assistant_types=$(for p in $pairs; do echo "${p##*:}"; done | sort -u)
draft=${DRAFT:-3}
gen=${GEN:-64}
runs=${RUNS:-9}
rounds=${ROUNDS:-2}
venv=${SPECD_GGUF_VENV:-$HOME/.cache/specd/venv-gguf}
py=$venv/bin/python
source "$root/tools/llamacpp_source.sh"
tree=$(llamacpp_tree "${SPECD_LLAMACPP_DIR:-$HOME/.cache/specd/llama.cpp}/src")

# 1. the target
for t in $target_types; do
    [ -f "$out/gemma4-medium-$t.gguf" ] || {
        log "no $out/gemma4-medium-$t.gguf: run TYPES=\"$(echo $target_types)\" tools/bench_gemma4_gguf.sh $out first"
        exit 1
    }
done
[ -f "$ckpt/config.json" ] || { log "no checkpoint in $ckpt: run tools/bench_gemma4_gguf.sh first"; exit 1; }

# 2. the assistant checkpoint
if [ ! -f "$assistant/config.json" ]; then
    log "building the medium random assistant in $assistant"
    (cd "$root/tools" && "$py" - "$ckpt" "$assistant" <<'EOF'
import json, sys
from pathlib import Path
import torch, transformers
torch.set_grad_enabled(False)
transformers.logging.set_verbosity_error()
from transformers import Gemma4TextConfig
from transformers.models.gemma4_assistant import Gemma4AssistantConfig, Gemma4AssistantForCausalLM
import hf_gemma4_workarounds
from gemma4_random_weights import randomize_text_weights
hf_gemma4_workarounds.install()

target = json.loads((Path(sys.argv[1]) / "config.json").read_text())
full = [i for i, t in enumerate(target["layer_types"]) if t == "full_attention"][0]
full_geometry = target["per_layer_config"].get(str(full), {})
SLIDING, FULL = "sliding_attention", "full_attention"
SEED = 17
text = Gemma4TextConfig(
    vocab_size=target["vocab_size"],
    hidden_size=256,
    intermediate_size=1024,
    num_hidden_layers=4,
    layer_types=[SLIDING, FULL, SLIDING, FULL],
    num_attention_heads=4,
    # The assistant's attention reads the target's shared K/V: its geometry is the target's.
    num_key_value_heads=target["num_key_value_heads"],
    head_dim=target["head_dim"],
    global_head_dim=full_geometry.get("head_dim", target["head_dim"]),
    num_global_key_value_heads=None,
    attention_k_eq_v=target["attention_k_eq_v"],
    sliding_window=target["sliding_window"],
    rope_parameters=target["rope_parameters"],
    rms_norm_eps=target["rms_norm_eps"],
    hidden_activation=target["hidden_activation"],
    max_position_embeddings=target["max_position_embeddings"],
    hidden_size_per_layer_input=0,
    vocab_size_per_layer_input=0,
    num_kv_shared_layers=4,
    use_double_wide_mlp=False,
    final_logit_softcapping=None,
    tie_word_embeddings=True,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
)
config = Gemma4AssistantConfig(
    text_config=text.to_dict(),
    backbone_hidden_size=target["hidden_size"],
    use_ordered_embeddings=False,
    tie_word_embeddings=True,
)
torch.manual_seed(SEED)
model = Gemma4AssistantForCausalLM(config).eval()
# Post-norms scaled down as for the test fixtures' assistants (see gemma4_random_weights.py).
randomize_text_weights(model, SEED, post_norm_scale=0.4)
model.save_pretrained(sys.argv[2])
print(sum(p.numel() for p in model.parameters()), "parameters", file=sys.stderr)
EOF
    )
fi

# 3. the assistant GGUF files
for t in $assistant_types; do
    gguf=$out/gemma4-medium-assistant-$t.gguf
    [ -f "$gguf" ] && continue
    log "converting $assistant to $gguf"
    llamacpp_convert "$py" "$tree" "$assistant" gemma4-medium-assistant "$t" "$gguf" \
        "$out/convert-assistant-$t.log" --loadable || exit 1
done

# 4./5. both sides, alternating
bin=$(LLAMACPP_PROBE_MODEL=$out/gemma4-medium-f32.gguf "$root/tools/build_llamacpp.sh")
[ -x "$bin/llama-speculative-simple" ] || { log "no llama-speculative-simple in $bin"; exit 1; }
log "llama.cpp binaries: $bin"
# BOS, then 127 byte tokens: 'a' and 'b' are single tokens of the stub vocabulary, a merge
# joins them, so the prompt is a string of digits (each a byte token).
prompt=$(python3 -c "print(''.join(str(i % 10) for i in range(127)))")
(cd "$root" && cargo bench -q -p specd-models --bench gemma4_assistant --no-run) 2>&1 | tail -3 >&2
specd=$root/target/release/specd
[ -x "$specd" ] || (cd "$root" && cargo build --release -p specd --bin specd)
for r in $(seq 1 "$rounds"); do
    for pair in $pairs; do
        tt=${pair%%:*} at=${pair##*:}
        target=$out/gemma4-medium-$tt.gguf
        drafter=$out/gemma4-medium-assistant-$at.gguf
        name=$tt-$at-k$draft-r$r
        log "round $r, target $tt, assistant $at: llama.cpp"
        "$bin/llama-speculative-simple" -m "$target" -md "$drafter" --spec-type draft-mtp \
            --spec-draft-n-max "$draft" --spec-draft-n-min 0 --spec-draft-p-min 0 -t "$threads" -td "$threads" \
            -c 1024 -n "$gen" --temp 0 -lv 4 -p "$prompt" \
            >"$out/mtp-llama-$name.log" 2>&1 \
            || { tail -30 "$out/mtp-llama-$name.log" >&2; exit 1; }
        log "round $r, target $tt, assistant $at: specd"
        (cd "$root" && SPECD_BENCH_GEMMA4_DIR=$target SPECD_BENCH_GEMMA4_ASSISTANT=$drafter \
            SPECD_BENCH_DRAFT=$draft SPECD_BENCH_RUNS=$runs SPECD_THREADS=$threads \
            RAYON_NUM_THREADS=$threads cargo bench -q -p specd-models --bench gemma4_assistant) \
            >"$out/mtp-specd-$name.json" 2>"$out/mtp-specd-$name.log" \
            || { log "specd could not run this pair: $(grep -m1 -o 'load the assistant.*' "$out/mtp-specd-$name.log" || tail -1 "$out/mtp-specd-$name.log")"; : >"$out/mtp-specd-$name.json"; }
        log "round $r, target $tt, assistant $at: specd round loop"
        SPECD_THREADS=$threads RAYON_NUM_THREADS=$threads "$specd" generate --target "$target" \
            --drafter "$drafter" --draft mtp --block-size $((draft + 1)) --prompt "$prompt" \
            --raw-prompt --max-tokens "$gen" --ignore-eos --json \
            >"$out/mtp-round-$name.json" 2>"$out/mtp-round-$name.log" \
            || { tail -5 "$out/mtp-round-$name.log" >&2; : >"$out/mtp-round-$name.json"; }
    done
done

python3 - "$out" "$pairs" "$rounds" "$draft" <<'PY'
import json, re, sys
from pathlib import Path

out, pairs, rounds, k = Path(sys.argv[1]), sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4])
def fmt(x):
    return "-" if x is None else f"{x:.3f}"
print("| target / assistant | round | specd ms per draft token, after a verify (back to back) | llama.cpp ms per draft token (tokens) | specd / llama.cpp | specd ms per round (rounds) | llama.cpp ms per round (rounds) | specd / llama.cpp |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for pair in pairs:
    tt, at = pair.split(":")
    for r in range(1, rounds + 1):
        name = f"{tt}-{at}-k{k}-r{r}"
        text = (out / f"mtp-llama-{name}.log").read_text()
        m = re.search(r"statistics\s+draft-mtp:.*?#gen tokens =\s*(\d+).*?dur\(b,g,a\) = ([\d.]+), ([\d.]+), ([\d.]+) ms", text)
        n = int(m.group(1)) if m else 0
        llama = float(m.group(3)) / n if n else None
        raw = (out / f"mtp-specd-{name}.json").read_text().strip()
        specd = warm = None
        if raw:
            res = json.loads(raw)["results"]["assistant_saved"][f"k{k}"]
            specd, warm = res["draft_step_after_verify_ms"], res["draft_step_ms"]
        ratio = f"{specd / llama:.2f}x" if specd and llama else "-"
        m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", text)
        rounds_llama = int(m.group(1)) if m else 0
        round_llama = float(m.group(2)) * 1e3 / rounds_llama if rounds_llama else None
        raw = (out / f"mtp-round-{name}.json").read_text().strip()
        round_specd, rounds_specd = None, 0
        if raw:
            res = json.loads(raw)
            speed, rounds_specd = res["speed"], res["stats"]["rounds"]
            if speed["decode_tokens"]:
                round_specd = speed["decode_seconds"] * 1e3 / speed["decode_tokens"]
        round_ratio = f"{round_specd / round_llama:.2f}x" if round_specd and round_llama else "-"
        print(f"| {tt.upper()} / {at.upper()} | {r} | {fmt(specd)} ({fmt(warm)}) | {fmt(llama)} ({n}) | {ratio} "
              f"| {fmt(round_specd)} ({rounds_specd}) | {fmt(round_llama)} ({rounds_llama}) | {round_ratio} |")
PY
