#!/usr/bin/env bash
# Plaintext against mutual TLS on the split services (the tiny Gemma 4 pair, loopback):
# what TLS costs per round where rounds are cheapest (BENCHMARKS.md, "What mutual TLS costs
# per round"). Each line is one request of N tokens (default 512) at block size BS (default
# 4): tokens/s, rounds and milliseconds per round. Needs curl and python3.
#
# Usage: tools/bench_tls.sh        (builds the release binary first)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release -p specd --manifest-path "$ROOT/Cargo.toml" >&2
B=$ROOT/target/release/specd
F=$ROOT/crates/models/tests/fixtures/gemma4
C=$(mktemp -d)
trap 'rm -rf "$C"' EXIT
bash "$ROOT/tools/make_dev_certs.sh" "$C" >/dev/null 2>&1
N=${N:-512}
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
wait_line() { for _ in $(seq 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done; cat "$1" >&2; return 1; }
measure() {
  local mode=$1 vp dp rp hp tls_v=() tls_r=() scheme=http curl_tls=()
  vp=$(port); dp=$(port); rp=$(port); hp=$(port)
  if [ "$mode" = mtls ]; then
    tls_v=(--tls-cert $C/verifier/tls.crt --tls-key $C/verifier/tls.key --tls-client-ca $C/ca.crt)
    tls_d=(--tls-cert $C/drafter/tls.crt --tls-key $C/drafter/tls.key --tls-client-ca $C/ca.crt)
    tls_r=(--tls-cert $C/router/tls.crt --tls-key $C/router/tls.key --upstream-tls-ca $C/ca.crt
           --upstream-tls-cert $C/router/tls.crt --upstream-tls-key $C/router/tls.key)
    scheme=https; curl_tls=(--cacert $C/ca.crt)
  else tls_d=(); fi
  $B serve verifier --listen 127.0.0.1:$vp --target $F/target-full "${tls_v[@]}" >$C/tb-v.log 2>&1 & local v=$!
  $B serve drafter --listen 127.0.0.1:$dp --drafter $F/assistant-dense --target $F/target-full "${tls_d[@]}" >$C/tb-d.log 2>&1 & local d=$!
  wait_line $C/tb-v.log "listening on"; wait_line $C/tb-d.log "listening on"
  $B serve router --listen 127.0.0.1:$rp --http-listen 127.0.0.1:$hp --verifier $scheme://localhost:$vp \
     --drafters $scheme://localhost:$dp --target $F/target-full "${tls_r[@]}" >$C/tb-r.log 2>&1 & local r=$!
  wait_line $C/tb-r.log "^listening on"
  local body="{\"prompt\": [2, 40, 41, 42, 43], \"max_tokens\": $N, \"temperature\": 0, \"specd\": {\"ignore_eos\": true, \"block_size\": ${BS:-4}}}"
  for i in 1 2 3 4 5; do
    local t0 t1
    t0=$(date +%s.%N)
    curl -s "${curl_tls[@]}" $scheme://localhost:$hp/v1/completions -H 'content-type: application/json' -d "$body" >$C/tb-out.json
    t1=$(date +%s.%N)
    python3 - "$mode" "$t0" "$t1" "$C/tb-out.json" <<'PY'
import json,sys
mode,t0,t1=sys.argv[1],float(sys.argv[2]),float(sys.argv[3])
a=json.load(open(sys.argv[4]))
n=a['usage']['completion_tokens']; s=a['specd']
print(f"{mode}\t{n/(t1-t0):.1f} tok/s\trounds {s['rounds']}\tms/round {(t1-t0)*1e3/s['rounds']:.3f}")
PY
  done
  kill $v $d $r; wait 2>/dev/null || true
}
measure plain; measure mtls; measure plain; measure mtls
