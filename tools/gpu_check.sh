#!/usr/bin/env bash
# Checks a `--features cuda` build of specd on a machine with an NVIDIA GPU, in one pass:
#   1. the tiny Gemma 4 fixtures (checkpoint directories and GGUF files, dense and MoE targets)
#      and a tiny random Qwen2 GGUF pair, each plain (--no-draft) and speculative (mtp, ngram,
#      hybrid, draft-model where they apply), on --device cuda and --device cpu of the same
#      binary: CUDA tokens against CPU tokens (and against REF_JSON, CPU tokens computed on
#      another machine, when given), and speculative against plain on each device (lossless);
#   2. speed on random-weight models of realistic size made on the spot by
#      tools/gpu_random_models.py (numpy only: such files are too large to ship): a 1.1B
#      Gemma 4 target (BF16 file; f32 and bf16 compute, CUDA) and Q8_0 Qwen2 GGUFs of
#      Qwen2.5-0.5B's and 1.5B's geometry (CUDA and CPU), plain against n-gram speculation on a
#      repetitive prompt (random weights repeat one token, so every draft is accepted: the
#      best case, the cost of a verify of k tokens against k plain steps).
# Usage: bash tools/gpu_check.sh BIN OUTDIR [REF_JSON]
#   BIN       the specd binary (built with --features cuda)
#   OUTDIR    where runs.jsonl, gpu_check.log, nvidia-smi.txt and table.md go
#   REF_JSON  optional: {"case": [tokens...]} from `--device cpu` runs elsewhere
# Environment: SPECD_ROOT=DIR takes the fixtures from DIR (default: the checkout holding this
# script); SKIP_FIXTURES=1 leaves out part 1, SKIP_SPEED=1 part 2; DEVICES=cpu SKIP_SPEED=1 runs
# part 1 on the CPU only, to produce REF_JSON with
# `python3 tools/gpu_check_report.py OUTDIR/runs.jsonl --ref-out FILE`; RUN_TIMEOUT=S (default
# 180) bounds each run.
# The CUDA libraries the binary links (cuBLAS, cuBLASLt, cuRAND, the CUDA runtime: major
# version 13, cuRAND 10, for a CUDA 13 build) are looked up under /usr/local and /opt (PyTorch's
# wheels ship them) when the loader cannot find them itself.
set -uo pipefail

BIN=$(realpath "${1:?usage: gpu_check.sh BIN OUTDIR [REF_JSON]}")
OUT=$(mkdir -p "${2:?usage: gpu_check.sh BIN OUTDIR [REF_JSON]}" && realpath "$2")
REF=${3:-}
DEVICES=${DEVICES:-"cuda cpu"}
TOOLS=$(cd "$(dirname "$0")" && pwd)
# The repository whose fixtures are used: the script's own by default.
ROOT=${SPECD_ROOT:-$(dirname "$TOOLS")}
cd "$ROOT"
LOG=$OUT/gpu_check.log
RUNS=$OUT/runs.jsonl
: >"$LOG"
: >"$RUNS"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

log() { echo "$*" | tee -a "$LOG"; }

missing_libs() { ldd "$BIN" 2>&1 | awk '/not found/ { print $1 }'; }
if [[ "$DEVICES" == *cuda* && -n "$(missing_libs)" ]]; then
    # One find for all of them; a CUDA toolkit's own copy first, so one library set is used.
    found=$(find /usr/local /opt -xdev -maxdepth 9 -name 'lib*.so.*' 2>/dev/null |
        awk '{ print (index($0, "/usr/local/cuda") == 1 ? 0 : 1) "\t" $0 }' | sort -s -k1,1 | cut -f2)
    dirs=""
    for lib in $(missing_libs); do
        hit=$(grep -m1 "/$lib\$" <<<"$found")
        if [[ -n "$hit" && ":$dirs" != *":$(dirname "$hit"):"* ]]; then dirs="$dirs$(dirname "$hit"):"; fi
    done
    export LD_LIBRARY_PATH="${dirs}${LD_LIBRARY_PATH:-}"
fi
log "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
ldd "$BIN" >>"$LOG" 2>&1
missing=$(missing_libs)
if [[ -n "$missing" ]]; then log "missing libraries: $missing"; fi
if command -v nvidia-smi >/dev/null; then
    nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
    log "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)"
fi
# candle loads its kernels as PTX, which the driver compiles at first use; its compute cache
# keeps them for the later runs (the default cache is smaller than candle's kernels).
export CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-$WORK/cuda-cache} CUDA_CACHE_MAXSIZE=${CUDA_CACHE_MAXSIZE:-4294967296}

# run CASE GROUP DEVICE ARGS...: one `specd generate --json`, appended to runs.jsonl with its
# exit status and wall time; GROUP names the plain case the tokens must equal (lossless).
run() {
    local case=$1 group=$2 device=$3
    shift 3
    local started ended rc
    started=$(date +%s.%N)
    # A hung run must not take the rest of the check with it.
    timeout "${RUN_TIMEOUT:-180}" "$BIN" generate --device "$device" --json --ignore-eos "$@" \
        >"$WORK/out.json" 2>"$WORK/err.txt"
    rc=$?
    ended=$(date +%s.%N)
    {
        echo "== $case [$device] rc=$rc: $BIN generate --device $device --json --ignore-eos $*"
        tail -n 20 "$WORK/err.txt"
    } >>"$LOG"
    python3 - "$case" "$group" "$device" "$rc" "$started" "$ended" "$WORK/out.json" "$WORK/err.txt" "$*" >>"$RUNS" <<'EOF'
import json, sys
case, group, device, rc, t0, t1, out, err, argv = sys.argv[1:]
try:
    result = json.loads(open(out).read())
except ValueError:
    result = None
lines = [l for l in open(err, errors="replace").read().splitlines() if l.strip()]
print(json.dumps({"case": case, "group": group, "device": device, "rc": int(rc),
                  "wall_s": float(t1) - float(t0), "args": argv, "result": result,
                  "error": None if int(rc) == 0 else "\n".join(lines[-3:])}))
EOF
    log "$(printf '%-28s %-5s rc=%d %6.2fs' "$case" "$device" "$rc" "$(awk "BEGIN { print $ended - $started }")")"
}

F=crates/models/tests/fixtures/gemma4
G=crates/models/tests/fixtures/gemma4-gguf
P="--prompt-ids 2,17,201 --max-tokens 32"
python3 "$TOOLS/gpu_random_models.py" qwen2 "$WORK/qwen2-tiny.gguf" --hidden 128 --ffn 256 --layers 2 \
    --heads 4 --kv-heads 2 --vocab 512 --seed 3 >>"$LOG"
python3 "$TOOLS/gpu_random_models.py" qwen2 "$WORK/qwen2-tiny-draft.gguf" --hidden 64 --ffn 128 --layers 1 \
    --heads 2 --kv-heads 1 --vocab 512 --seed 4 >>"$LOG"
QT=$WORK/qwen2-tiny.gguf QD=$WORK/qwen2-tiny-draft.gguf
QP="--prompt-ids 5,6,7,8,5,6,7,8,5,6,7,8 --max-tokens 64"

if [[ -z "${SKIP_FIXTURES:-}" ]]; then
    log "== part 1: fixtures"
    for dev in $DEVICES; do
        run dense dense "$dev" --target $F/target-full --no-draft $P
        run dense-mtp4 dense "$dev" --target $F/target-full --draft mtp --drafter $F/assistant-dense --block-size 4 $P
        run dense-mtp-auto dense "$dev" --target $F/target-full --draft mtp --drafter $F/assistant-dense $P
        run dense-centroid4 dense "$dev" --target $F/target-full --draft mtp --drafter $F/assistant-centroid --block-size 4 $P
        run dense-ngram4 dense "$dev" --target $F/target-full --draft ngram --block-size 4 $P
        run dense-hybrid4 dense "$dev" --target $F/target-full --draft hybrid --drafter $F/assistant-dense --block-size 4 $P
        run moe moe "$dev" --target $F/target-moe --no-draft $P
        run moe-mtp4 moe "$dev" --target $F/target-moe --draft mtp --drafter $F/assistant-moe --block-size 4 $P
        run moe-ngram4 moe "$dev" --target $F/target-moe --draft ngram --block-size 4 $P
        run nople nople "$dev" --target $F/target-nople --no-draft $P
        run nople-mtp4 nople "$dev" --target $F/target-nople --draft mtp --drafter $F/assistant-nople --block-size 4 $P
        run multimodal multimodal "$dev" --target $F/target-multimodal --no-draft $P
        run sharded-bf16 sharded-bf16 "$dev" --target $F/target-sharded-bf16 --no-draft $P
        run dense-bf16 dense-bf16 "$dev" --target $F/target-full --dtype bf16 --no-draft $P
        run dense-bf16-mtp4 dense-bf16 "$dev" --target $F/target-full --dtype bf16 --draft mtp --drafter $F/assistant-dense --block-size 4 $P
        run gguf-dense gguf-dense "$dev" --target $G/target-full-f32.gguf --no-draft $P
        run gguf-dense-mtp4 gguf-dense "$dev" --target $G/target-full-f32.gguf --draft mtp --drafter $G/assistant-dense-f32.gguf --block-size 4 $P
        run gguf-moe gguf-moe "$dev" --target $G/target-moe-f32.gguf --no-draft $P
        run gguf-moe-mtp4 gguf-moe "$dev" --target $G/target-moe-f32.gguf --draft mtp --drafter $G/assistant-moe-f32.gguf --block-size 4 $P
        run gguf-dense-q8 gguf-dense-q8 "$dev" --target $G/target-full-q8_0.gguf --no-draft $P
        run qwen2 qwen2 "$dev" --target "$QT" --no-draft $QP
        run qwen2-ngram4 qwen2 "$dev" --target "$QT" --draft ngram --block-size 4 $QP
        run qwen2-draft4 qwen2 "$dev" --target "$QT" --draft draft-model --drafter "$QD" --block-size 4 $QP
        run qwen2-draft-auto qwen2 "$dev" --target "$QT" --draft draft-model --drafter "$QD" $QP
    done
fi

if [[ -z "${SKIP_SPEED:-}" ]]; then
    log "== part 2: speed on random weights"
    python3 "$TOOLS/gpu_random_models.py" gemma4 "$WORK/gemma4-1b" >>"$LOG" 2>&1 &
    python3 "$TOOLS/gpu_random_models.py" qwen2 "$WORK/qwen2-0.5b.gguf" >>"$LOG" 2>&1 &
    # Qwen2.5-1.5B's geometry: the demo pair's target (Q8_0 here, Q4_K_M there).
    python3 "$TOOLS/gpu_random_models.py" qwen2 "$WORK/qwen2-1.5b.gguf" --hidden 1536 --ffn 8960 \
        --layers 28 --heads 12 --kv-heads 2 >>"$LOG" 2>&1 &
    wait
    # A prompt that repeats itself: prompt lookup finds matches from the start.
    rep=$(python3 -c "print(','.join(['2'] + [str(100 + i % 16) for i in range(64)]))")
    M="--target $WORK/gemma4-1b --prompt-ids $rep --max-tokens 256"
    for dt in bf16 f32; do
        run g4-1b-$dt g4-1b-$dt cuda $M --dtype $dt --no-draft
        run g4-1b-$dt-ngram-auto g4-1b-$dt cuda $M --dtype $dt --draft ngram
        run g4-1b-$dt-ngram4 g4-1b-$dt cuda $M --dtype $dt --draft ngram --block-size 4
        run g4-1b-$dt-ngram8 g4-1b-$dt cuda $M --dtype $dt --draft ngram --block-size 8
    done
    # The same weights on both devices, f32 compute: where do the tokens part?
    for dev in $DEVICES; do
        run g4-1b-f32-32 g4-1b-f32-32 "$dev" --target "$WORK/gemma4-1b" --prompt-ids "$rep" \
            --max-tokens 32 --dtype f32 --no-draft
    done
    for size in 0.5b 1.5b; do
        Q="--target $WORK/qwen2-$size.gguf --prompt-ids $rep --max-tokens 256"
        for dev in $DEVICES; do
            run q2-$size q2-$size "$dev" $Q --no-draft
            run q2-$size-ngram-auto q2-$size "$dev" $Q --draft ngram
            run q2-$size-ngram4 q2-$size "$dev" $Q --draft ngram --block-size 4
        done
    done
fi

python3 "$TOOLS/gpu_check_report.py" "$RUNS" ${REF:+--ref "$REF"} | tee "$OUT/table.md"
