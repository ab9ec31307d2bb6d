#!/usr/bin/env bash
# Builds the cargo-fuzz targets in fuzz/ and runs each for a bounded time, starting from a
# temporary copy of its committed seed corpus (fuzz/corpus/<target>/ is never written).
# Exits non-zero if any target crashes, panics, times out or runs out of memory; the
# crashing input is printed (base64) and left in fuzz/artifacts/<target>/.
#
# Runs on the stable toolchain: with --sanitizer none, cargo-fuzz passes only stable rustc
# flags (sanitizer-coverage instrumentation through -Cpasses and -Cllvm-args), and
# libfuzzer-sys builds libFuzzer with the system C++ compiler.
#
# Environment:
#   SPECD_FUZZ_SECS      seconds per target (default 30)
#   SPECD_FUZZ_PROFILE   dev (default: quick to build) or release (several times more
#                        executions per second, for long runs)
#   SPECD_FUZZ_TARGETS   space-separated targets to run (default: all)
#   SPECD_FUZZ_JOBS      targets fuzzed at once (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${SPECD_FUZZ_SECS:-30}"
profile="${SPECD_FUZZ_PROFILE:-dev}"
jobs="${SPECD_FUZZ_JOBS:-2}"
# Both keep debug assertions and overflow checks on (cargo-fuzz's default release build does;
# `--release` alone would turn them off and hide overflow bugs).
case "$profile" in
  dev) profile_flags=(--dev) ;;
  release) profile_flags=() ;;
  *) echo "SPECD_FUZZ_PROFILE must be dev or release, got '$profile'" >&2; exit 2 ;;
esac

export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz into ~/.cargo/bin"
  cargo install cargo-fuzz --locked
fi
cargo fuzz --version

targets="${SPECD_FUZZ_TARGETS:-$(cargo fuzz list)}"
echo "== building fuzz targets ($profile profile)"
start=$SECONDS
cargo fuzz build --sanitizer none "${profile_flags[@]}"
echo "built in $((SECONDS - start)) s"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# One target: fresh working corpus, bounded run, log and crashing inputs under $work.
run_target() {
  local target="$1" dir="$work/$1"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp -R "fuzz/corpus/$target/." "$dir/corpus/"
  # A per-input timeout well under the run time, so a hang is reported as a crash.
  cargo fuzz run --sanitizer none "${profile_flags[@]}" "$target" "$dir/corpus" -- \
    -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/" >"$dir/log" 2>&1
}

failed=()
report() {
  local target="$1" status="$2" dir="$work/$1"
  if [ "$status" -eq 0 ]; then
    local runs
    runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$dir/log" | grep -o '[0-9]*$' || true)"
    echo "ok      $target (${runs:-?} inputs)"
    return
  fi
  echo "FAILED  $target (exit $status)"
  tail -n 60 "$dir/log"
  mkdir -p "fuzz/artifacts/$target"
  for artifact in "$dir"/artifacts/*; do
    [ -f "$artifact" ] || continue
    cp "$artifact" "fuzz/artifacts/$target/"
    echo "-- fuzz/artifacts/$target/$(basename "$artifact") (base64):"
    base64 -w 0 "$artifact" | head -c 8192
    echo
  done
  failed+=("$target")
}

echo "== fuzzing each target for ${secs} s, ${jobs} at a time"
set -- $targets
while [ "$#" -gt 0 ]; do
  batch=()
  pids=()
  while [ "$#" -gt 0 ] && [ "${#batch[@]}" -lt "$jobs" ]; do
    run_target "$1" &
    batch+=("$1")
    pids+=("$!")
    shift
  done
  for i in "${!batch[@]}"; do
    status=0
    wait "${pids[$i]}" || status=$?
    report "${batch[$i]}" "$status"
  done
done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzzing found crashes in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzzing: no crashes"
