# Sourced (never run) by the benchmarks of the real Qwen2.5-Coder 1.5B / 0.5B pair: where the
# repository and the pair are, fetching the pair when it is missing, and the steps each of
# those benchmarks takes.
#
# Sets repo, models, target and drafter. Honours SPECD_MODEL_DIR (the model cache),
# SPECD_LLAMACPP_DIR, LLAMACPP_PROBE_MODEL and CARGO_TARGET_DIR.

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
models=${SPECD_MODEL_DIR:-$HOME/.cache/specd/models}
target=$models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
drafter=$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
"$repo/tools/fetch_qwen_pair.sh" "$models"

# Prints the directory of llama.cpp's binaries, building them when missing. The probe makes
# the build prove it runs batches of the target (see build_llamacpp.sh).
llamacpp_bin() {
    LLAMACPP_PROBE_MODEL=${LLAMACPP_PROBE_MODEL:-$target} "$repo/tools/build_llamacpp.sh"
}

# Builds the release packages named (`-p specd -p specd-bench`) and sets bin, specd and
# specd_bench to the binaries.
build_release() {
    (cd "$repo" && cargo build --release "$@")
    bin=${CARGO_TARGET_DIR:-$repo/target}/release
    specd=$bin/specd
    specd_bench=$bin/specd-bench
}

# Writes the date, the host, each further argument as a line, and the load before the run
# to DIR/machine.txt (and stdout).
note_machine() {
    local dir=$1 line
    shift
    {
        echo "date: $(date -u)"
        echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
        for line in "$@"; do
            echo "$line"
        done
        echo "load before: $(uptime)"
    } | tee "$dir/machine.txt"
}

# Adds the load after the run to DIR/machine.txt.
note_load_after() {
    echo "load after: $(uptime)" | tee -a "$1/machine.txt"
}

# Services that start_service started; they are stopped when the script exits.
pids=()
stop_services() {
    local pid
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap stop_services EXIT

# start_service NAME CORE ARGS...: runs `$specd serve ARGS` on a free port (pinned to CORE
# with taskset unless CORE is empty), its log in $out/NAME.log, and waits for its gRPC
# `listening on` line, whose address it leaves in $addr.
start_service() {
    local name=$1 core=$2 log=$out/$1.log
    shift 2
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
    echo "$(basename "$0"): $name did not start; see $log" >&2
    exit 1
}

# The HTTP address service NAME logged.
http_of() { sed -n 's/^http listening on //p' "$out/$1.log" | head -1; }
