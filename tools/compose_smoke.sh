#!/usr/bin/env bash
# End-to-end run of deploy/ on this machine: builds the images, starts the project's compose
# file on the host network and checks the running services the way an operator would, then
# tears everything down. Exits non-zero on the first failure, naming it.
#
#   tools/compose_smoke.sh          (as root: it installs packages and runs dockerd if needed)
#
# What it does:
#   1. Docker: installs Debian's docker.io when there is no engine and starts dockerd when
#      none answers; Compose v2 (2.24 or later, for the `!reset` tags of compose.host.yaml)
#      from Debian's package when the CLI has none.
#   2. Images, asking no registry: the base image from Debian's archive (`debootstrap
#      --variant=minbase`, then `docker import`), tagged by a hash of its recipe so it is made
#      once; specd's runtime image from deploy/Dockerfile.prebuilt (deploy/Dockerfile's
#      runtime part) around the release binary built here; Prometheus from Debian's package
#      on the same base (tools/compose_smoke/Dockerfile.prometheus).
#   3. The model pair (tools/fetch_qwen_pair.sh when missing), the development certificates
#      (tools/make_dev_certs.sh) and an API key for the router.
#   4. The reference: the same requests against `specd serve` run in one process here.
#   5. deploy/compose.yaml + deploy/compose.host.yaml (host networking, loopback only) +
#      tools/compose_smoke/compose.smoke.yaml, with `--scale drafter=2`, then the checks of
#      tools/compose_smoke.py: `specd health`, API keys, models listed, streamed chat
#      completions equal to the reference (greedy and seeded), requests spread over both
#      drafters, a drafter killed mid-stream with the stream still equal, the verifier's K/V
#      budget and limits as configured, Prometheus scraping every service.
#
# Environment:
#   SPECD_MODEL_DIR       the GGUF pair (default ~/.cache/specd/models)
#   SPECD_SMOKE_PYTHON    a Python with `openai` installed (default: a virtual environment
#                         made at ~/.cache/specd/venv-smoke)
#   SPECD_SMOKE_KEEP=1    leave the containers running after the checks (for a look around)
#   SPECD_SMOKE_BINARY    a specd release binary to use instead of building one
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

PROJECT=specd-smoke
DEBIAN_RELEASE=bookworm
MIRROR=${SPECD_SMOKE_MIRROR:-http://deb.debian.org/debian}
MODEL_DIR=${SPECD_MODEL_DIR:-$HOME/.cache/specd/models}
TARGET_FILE=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
DRAFTER_FILE=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
# Limits the checks expect to find (not compose.yaml's defaults, so a setting that does not
# reach the verifier shows).
MAX_KV_TOKENS=6144
BATCH_MAX_ROWS=8
PROMETHEUS_PORT=9089
REFERENCE_HTTP=127.0.0.1:18000
REFERENCE_GRPC=127.0.0.1:18050

work=$(mktemp -d /tmp/specd-smoke.XXXXXX)
chmod 755 "$work"
step="setup"
reference_pid=
compose_up=no
compose=(docker compose -p "$PROJECT" -f deploy/compose.yaml -f deploy/compose.host.yaml
    -f tools/compose_smoke/compose.smoke.yaml)

say() { printf '== %s\n' "$*" >&2; }
begin() {
    step=$1
    say "$step"
}
fail() {
    echo "compose_smoke: FAILED at '$step': $*" >&2
    exit 1
}

cleanup() {
    local status=$?
    if [ -n "$reference_pid" ]; then
        kill "$reference_pid" 2>/dev/null || true
        wait "$reference_pid" 2>/dev/null || true
    fi
    if [ "$compose_up" = yes ]; then
        if [ "$status" -ne 0 ]; then
            echo "-- the last lines of each service's log:" >&2
            "${compose[@]}" logs --no-color --tail=25 >&2 || true
        fi
        if [ "${SPECD_SMOKE_KEEP:-0}" = 1 ]; then
            echo "compose_smoke: left running; stop with: ${compose[*]} down -v" >&2
        else
            "${compose[@]}" down -v --remove-orphans --timeout 10 >/dev/null 2>&1 || true
        fi
    fi
    [ "${SPECD_SMOKE_KEEP:-0}" = 1 ] || rm -rf "$work"
    if [ "$status" -eq 0 ]; then
        echo "compose_smoke: all checks passed"
    fi
    exit "$status"
}
trap cleanup EXIT

# ------------------------------------------------------------------------------ 1. Docker

ensure_docker() {
    if ! command -v dockerd >/dev/null 2>&1; then
        say "installing docker.io"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >/dev/null
    fi
    if ! docker info >/dev/null 2>&1; then
        say "starting dockerd (log: /var/log/specd-smoke-dockerd.log)"
        nohup dockerd >/var/log/specd-smoke-dockerd.log 2>&1 &
        for _ in $(seq 60); do
            docker info >/dev/null 2>&1 && break
            sleep 1
        done
        docker info >/dev/null 2>&1 || fail "dockerd did not answer within 60 s"
    fi
    if ! compose_recent; then
        install_compose_v2
        compose_recent || fail "docker compose 2.24 or later is needed: $(docker compose version 2>&1 | head -1)"
    fi
}

# Compose 2.24.4 brought the `!reset` and `!override` tags compose.host.yaml uses.
compose_recent() {
    local version
    version=$(docker compose version --short 2>/dev/null) || return 1
    version=${version#v}
    [ "$(printf '%s\n%s\n' 2.24.4 "${version%%-*}" | sort -V | head -1)" = 2.24.4 ]
}

# Debian's docker-compose package is Compose v2 from trixie on (a Go binary that needs only
# glibc); bookworm's is the old Python v1, which reads none of this.
install_compose_v2() {
    say "installing Compose v2 from Debian's docker-compose package (trixie)"
    local index=$work/Packages.xz file
    curl -fsS -m 120 -o "$index" "$MIRROR/dists/trixie/main/binary-amd64/Packages.xz" ||
        fail "cannot read Debian's package index at $MIRROR"
    # awk reads the whole index: leaving early would break the pipe (and pipefail).
    file=$(xz -dc "$index" | awk '/^Package: /{p=($2=="docker-compose")} p&&/^Filename: /&&!f{print $2; f=1}')
    [ -n "$file" ] || fail "no docker-compose package in Debian trixie's index"
    curl -fsS -m 300 -o "$work/compose.deb" "$MIRROR/$file" || fail "cannot download $MIRROR/$file"
    dpkg-deb -x "$work/compose.deb" "$work/compose"
    install -D -m 0755 "$work/compose/usr/libexec/docker/cli-plugins/docker-compose" \
        /usr/local/lib/docker/cli-plugins/docker-compose
}

# ------------------------------------------------------------------------------ 2. images

base_image() {
    local recipe tag rootfs
    recipe="debootstrap --variant=minbase --include=ca-certificates $DEBIAN_RELEASE"
    tag="specd-base:$DEBIAN_RELEASE-$(printf '%s' "$recipe" | sha256sum | cut -c1-12)"
    if ! docker image inspect "$tag" >/dev/null 2>&1; then
        command -v debootstrap >/dev/null 2>&1 ||
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
        rootfs=$work/rootfs
        say "making $tag with debootstrap (a few minutes)"
        # shellcheck disable=SC2086
        $recipe "$rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 ||
            { tail -20 "$work/debootstrap.log" >&2; fail "debootstrap failed"; }
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        tar -C "$rootfs" -c . | docker import -c 'CMD ["/bin/bash"]' - "$tag" >/dev/null
        rm -rf "$rootfs"
    fi
    echo "$tag"
}

build_images() {
    local base=$1 binary
    if [ -n "${SPECD_SMOKE_BINARY:-}" ]; then
        binary=$SPECD_SMOKE_BINARY
    else
        say "building the release binary"
        cargo build --release --locked -q -p specd
        binary=target/release/specd
    fi
    mkdir -p "$work/context"
    cp "$binary" "$work/context/specd"
    say "building specd:smoke from deploy/Dockerfile.prebuilt on $base"
    docker build -q --network host -f deploy/Dockerfile.prebuilt \
        --build-arg BASE_IMAGE="$base" -t specd:smoke "$work/context" >/dev/null ||
        fail "docker build of deploy/Dockerfile.prebuilt failed"
    docker run --rm --entrypoint sh specd:smoke -c 'id -u && specd --version' >"$work/image.txt" ||
        fail "specd does not run in the image"
    [ "$(head -1 "$work/image.txt")" = 10001 ] || fail "the image runs as uid $(head -1 "$work/image.txt"), not 10001"

    local dockerfile=tools/compose_smoke/Dockerfile.prometheus
    PROMETHEUS_IMAGE="specd-prometheus:$(cat "$dockerfile" <(echo "$base") | sha256sum | cut -c1-12)"
    if ! docker image inspect "$PROMETHEUS_IMAGE" >/dev/null 2>&1; then
        say "building $PROMETHEUS_IMAGE from Debian's prometheus package"
        docker build -q --network host -f "$dockerfile" --build-arg BASE_IMAGE="$base" \
            -t "$PROMETHEUS_IMAGE" tools/compose_smoke >/dev/null ||
            fail "docker build of $dockerfile failed"
    fi
}

# ------------------------------------------------------------------------------ 3. inputs

python_with_openai() {
    if [ -n "${SPECD_SMOKE_PYTHON:-}" ]; then
        echo "$SPECD_SMOKE_PYTHON"
        return
    fi
    local venv=$HOME/.cache/specd/venv-smoke
    if ! "$venv/bin/python" -c 'import openai' 2>/dev/null; then
        python3 -m venv "$venv" >&2
        "$venv/bin/pip" install -q 'openai>=1.40,<3' >&2 || fail "cannot install openai from PyPI"
    fi
    echo "$venv/bin/python"
}

wait_for_http() {
    local url=$1 pid=$2
    for _ in $(seq 300); do
        curl -fsS -o /dev/null "$url" 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 1
    done
    return 1
}

# ------------------------------------------------------------------------------ the run

begin "docker"
ensure_docker
say "$(docker version --format 'engine {{.Server.Version}}') · $(docker compose version)"

begin "images"
base=$(base_image)
build_images "$base"
say "images: $base, specd:smoke ($(tail -1 "$work/image.txt")), $PROMETHEUS_IMAGE"

begin "models and certificates"
if [ ! -s "$MODEL_DIR/$TARGET_FILE" ] || [ ! -s "$MODEL_DIR/$DRAFTER_FILE" ]; then
    SPECD_MODEL_DIR=$MODEL_DIR tools/fetch_qwen_pair.sh
fi
tools/make_dev_certs.sh >/dev/null
api_key="sk-smoke-$(openssl rand -hex 16)"
(umask 022 && echo "smoke:$api_key" >deploy/certs/router/api-keys.smoke)
PYTHON=$(python_with_openai)
specd_bin=${SPECD_SMOKE_BINARY:-target/release/specd}

begin "reference (one process)"
"$specd_bin" serve --target "$MODEL_DIR/$TARGET_FILE" --drafter "$MODEL_DIR/$DRAFTER_FILE" \
    --listen "$REFERENCE_GRPC" --http-listen "$REFERENCE_HTTP" >"$work/reference.log" 2>&1 &
reference_pid=$!
wait_for_http "http://$REFERENCE_HTTP/v1/models" "$reference_pid" ||
    { tail -20 "$work/reference.log" >&2; fail "the one-process server did not come up"; }
"$PYTHON" tools/compose_smoke.py reference --base-url "http://$REFERENCE_HTTP/v1" \
    --out "$work/reference.json" || fail "the reference requests failed"
kill "$reference_pid"
wait "$reference_pid" 2>/dev/null || true
reference_pid=

begin "compose up (host network, --scale drafter=2)"
slots=$work/slots
mkdir -p "$slots"
chmod 1777 "$slots"
export SPECD_IMAGE=specd:smoke SPECD_SMOKE_PROMETHEUS_IMAGE=$PROMETHEUS_IMAGE \
    SPECD_LISTEN_HOST=127.0.0.1 SPECD_DRAFTER_SLOT_DIR=$slots SPECD_OTLP_ENDPOINT='' \
    SPECD_MODEL_DIR=$MODEL_DIR SPECD_TARGET_FILE=$TARGET_FILE SPECD_DRAFTER_FILE=$DRAFTER_FILE \
    SPECD_MAX_KV_TOKENS=$MAX_KV_TOKENS SPECD_BATCH_MAX_ROWS=$BATCH_MAX_ROWS \
    SPECD_HOST_PROMETHEUS_PORT=$PROMETHEUS_PORT
"${compose[@]}" config --quiet || fail "compose rejects the files"
compose_up=yes
started=$(date +%s)
"${compose[@]}" up -d --no-build --scale drafter=2 --wait --wait-timeout 600 ||
    fail "the services did not all become healthy"
say "healthy after $(($(date +%s) - started)) s"
"${compose[@]}" ps --format '{{.Name}} {{.Status}}'

begin "specd health"
"$specd_bin" health --addr https://127.0.0.1:50050 --tls-ca deploy/certs/ca.crt >/dev/null ||
    fail "specd health of the router"
"$specd_bin" health --addr https://127.0.0.1:50051 --tls-ca deploy/certs/ca.crt \
    --tls-cert deploy/certs/router/client.crt --tls-key deploy/certs/router/client.key >/dev/null ||
    fail "specd health of the verifier"

begin "checks against the running services"
"$PYTHON" tools/compose_smoke.py served --base-url https://127.0.0.1:8000/v1 \
    --ca deploy/certs/ca.crt --api-key "$api_key" --reference "$work/reference.json" \
    --project "$PROJECT" --prometheus "http://127.0.0.1:$PROMETHEUS_PORT" \
    --max-kv-tokens "$MAX_KV_TOKENS" --batch-max-rows "$BATCH_MAX_ROWS" \
    --compose-file deploy/compose.yaml --compose-file deploy/compose.host.yaml \
    --compose-file tools/compose_smoke/compose.smoke.yaml ||
    fail "a check of tools/compose_smoke.py (named above)"
