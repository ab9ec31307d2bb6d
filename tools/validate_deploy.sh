#!/usr/bin/env bash
# Validates deploy/ (CI runs it from .ci/run; seconds once the validators are installed):
#   1. the Kubernetes manifests in deploy/k8s against the Kubernetes API schemas (strict:
#      unknown fields are errors), for the oldest and the newest version we support, and the
#      kustomization's rendered output too when kubectl is installed;
#   2. deploy/compose.yaml and its GPU override against the Compose specification's schema;
#   3. tools/validate_deploy.py: the dashboard's queries against the telemetry contract
#      (deploy/metrics.txt) and the files against each other (ports, names, probes), and
#      the security settings no schema knows: TLS and mutual TLS, API keys, what compose
#      publishes, and what the NetworkPolicies let through.
# The validators (kubernetes-validate and check-jsonschema, which carry their schemas, so no
# schema is fetched at run time) are installed from PyPI into a virtual environment at
# $SPECD_DEPLOY_VENV (default ~/.cache/specd/venv-deploy). If they cannot be installed,
# schema validation is skipped with a loud warning; any invalid file fails.
#
# Usage: tools/validate_deploy.sh [--self-test] [DEPLOY_DIR]   (default: this checkout's deploy/)
#   exit 0: valid (or validators unavailable), 1: invalid.
#   --self-test: first break copies of DEPLOY_DIR in known ways and require each to be
#   refused with the expected message, so a validator that stopped catching errors fails.
set -euo pipefail

self_test=no
if [ "${1:-}" = "--self-test" ]; then
    self_test=yes
    shift
fi
DEPLOY=$(realpath "${1:-$(dirname "$0")/../deploy}")
readonly DEPLOY
SELF=$(realpath "$0")
readonly SELF
readonly K8S_DIR="$DEPLOY/k8s"
cd "$(dirname "$SELF")/.."

readonly VENV="${SPECD_DEPLOY_VENV:-$HOME/.cache/specd/venv-deploy}"
readonly REQUIREMENTS="kubernetes-validate==1.37.0 check-jsonschema==0.39.0 PyYAML==6.0.4"
# autoscaling/v2 is GA from 1.23 and NetworkPolicy long before; 1.29 is the oldest checked.
readonly KUBERNETES_VERSIONS="1.29.0 1.37.0"

failures=0
fail() {
    echo "ERROR: $*" >&2
    failures=$((failures + 1))
}

banner() {
    echo "############################################################################" >&2
    while [ $# -gt 0 ]; do
        printf '## %-72s ##\n' "$1" >&2
        shift
    done
    echo "############################################################################" >&2
}

# Installs the pinned validators once; later runs reuse the environment.
ensure_validators() {
    if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.requirements" 2>/dev/null)" = "$REQUIREMENTS" ]; then
        return 0
    fi
    command -v python3 >/dev/null 2>&1 || return 1
    echo "installing $REQUIREMENTS into $VENV"
    python3 -m venv --clear "$VENV" >/dev/null || return 1
    # shellcheck disable=SC2086 # the requirements are separate words
    timeout 300 "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        --timeout 20 --retries 2 $REQUIREMENTS || return 1
    echo "$REQUIREMENTS" >"$VENV/.requirements"
}

# One deliberate defect per case: file (under DEPLOY_DIR), sed expression, and a fragment
# the refusal must contain. The schema cases need the validators.
SELF_TEST_CASES=(
    "k8s/router.yaml|s/^  replicas: 2$/  replicaz: 2/|'replicaz' was unexpected|schema"
    "k8s/drafter-hpa.yaml|s/averageUtilization: 70/averageUtilization: seventy/|is not of type 'integer'|schema"
    "compose.yaml|s/^    restart: unless-stopped$/    restartt: always/|'restartt' was unexpected|schema"
    "grafana/dashboards/specd.json|s/specd_kv_bytes)/specd_kv_byte)/|metric specd_kv_byte is not in the telemetry contract|"
    "grafana/dashboards/specd.json|s/side=\\\\\"client\\\\\"/side=\\\\\"clinet\\\\\"/|side='clinet' is not a value|"
    "k8s/router.yaml|s/--drafter-dns=specd-drafters:/--drafter-dns=specd-drafter:/|no Service specd-drafter|"
    "prometheus.yml|s/router:9090/router:9999/|does not scrape router:9090|"
    "compose.yaml|s/SPECD_BIND:-127.0.0.1/SPECD_BIND:-0.0.0.0/|publishes port 50050 on 0.0.0.0, not the loopback interface|"
    "compose.yaml|s#https://verifier:50051#http://verifier:50051#|--verifier http://verifier:50051 is not https|"
    "k8s/verifier.yaml|s/name: SPECD_TLS_CLIENT_CA$/name: SPECD_TLS_CLIENT_CA_FILE/|no SPECD_TLS_CLIENT_CA in its environment|"
    "k8s/drafter.yaml|s#--addr=https://127.0.0.1:50052#--addr=http://127.0.0.1:50052#|--addr http://127.0.0.1:50052 is not https|"
    "k8s/router.yaml|s/secretName: specd-api-keys/secretName: specd-keys/|not the Secret specd-api-keys|"
    "k8s/networkpolicy.yaml|s#podSelector: {}#podSelector: {matchLabels: {app.kubernetes.io/component: router}}#|none denies ingress by default|"
    "k8s/networkpolicy.yaml|s/component: router$/component: drafter/|drafter pods reach the verifier pods on port 50051|"
    "Dockerfile.prebuilt|s/ca-certificates \\\\$/ca-certificates curl \\\\/|its runtime stage differs from Dockerfile's|"
    "compose.host.yaml|s/drafter:127.0.0.5/drafter:127.0.0.6/|not the slots|"
    "prometheus.host.yml|s/127.0.0.3:9092/127.0.0.3:9999/|does not scrape the drafter slot 127.0.0.3:9092|"
    "compose.host.yaml|s/^    <<: \\[\\*host-network, \\*host-names\\]$/    <<: *host-names/|not on the host network|"
)

run_self_test() {
    local have_validators=$1 tmp case file expr expect needs log rc
    tmp=$(mktemp -d)
    # shellcheck disable=SC2064 # expand now: tmp is local
    trap "rm -rf '$tmp'" EXIT
    for case in "${SELF_TEST_CASES[@]}"; do
        IFS='|' read -r file expr expect needs <<<"$case"
        if [ "$needs" = schema ] && [ "$have_validators" = no ]; then
            continue
        fi
        rm -rf "$tmp/deploy" && cp -r "$DEPLOY" "$tmp/deploy"
        sed -i "$expr" "$tmp/deploy/$file"
        if cmp -s "$DEPLOY/$file" "$tmp/deploy/$file"; then
            fail "self-test: '$expr' no longer changes $file; update the case"
            continue
        fi
        log="$tmp/log"
        rc=0
        bash "$SELF" "$tmp/deploy" >"$log" 2>&1 || rc=$?
        if [ "$rc" -ne 1 ] || ! grep -qF -- "$expect" "$log"; then
            cat "$log" >&2
            fail "self-test: breaking $file with '$expr' was not refused with \"$expect\" (exit $rc)"
        else
            echo "  refused as expected: $file ($expect)"
        fi
    done
    rm -rf "$tmp"
}

validators=yes
if ! ensure_validators; then
    validators=no
    banner "WARNING: the deploy validators could not be installed from PyPI." \
        "Kubernetes and Compose SCHEMA VALIDATION IS SKIPPED." \
        "Only the cross-checks of tools/validate_deploy.py run."
    echo "To install by hand: $VENV/bin/pip install $REQUIREMENTS" >&2
fi

if [ "$self_test" = yes ]; then
    echo "== self-test: broken copies of $DEPLOY must be refused"
    run_self_test "$validators"
fi

if [ "$validators" = yes ]; then
    echo "== Kubernetes manifests ($K8S_DIR) against the API schemas"
    manifests=()
    for f in "$K8S_DIR"/*.yaml; do
        [ "$(basename "$f")" = kustomization.yaml ] || manifests+=("$f")
    done
    for version in $KUBERNETES_VERSIONS; do
        if ! "$VENV/bin/kubernetes-validate" --strict --quiet -k "$version" "${manifests[@]}"; then
            fail "Kubernetes manifests do not validate against Kubernetes $version (see above)"
        fi
    done
    if command -v kubectl >/dev/null 2>&1; then
        rendered=$(mktemp --suffix=.yaml)
        if ! kubectl kustomize "$K8S_DIR" >"$rendered"; then
            fail "kubectl kustomize $K8S_DIR failed"
        elif ! "$VENV/bin/kubernetes-validate" --strict --quiet "$rendered"; then
            fail "the kustomization's rendered output does not validate (see above)"
        else
            echo "  kustomization renders $(grep -c '^kind:' "$rendered") valid objects"
        fi
        rm -f "$rendered"
    else
        echo "  (kubectl not installed: the kustomization is checked by validate_deploy.py only)"
    fi

    echo "== $DEPLOY/compose*.yaml against the Compose specification"
    if ! "$VENV/bin/check-jsonschema" --builtin-schema vendor.compose-spec "$DEPLOY"/compose*.yaml; then
        fail "$DEPLOY/compose*.yaml do not validate against the Compose specification"
    fi
fi

echo "== dashboard against the telemetry contract; cross-checks of $DEPLOY"
python_bin=python3
[ "$validators" = yes ] && python_bin="$VENV/bin/python"
if command -v "$python_bin" >/dev/null 2>&1; then
    if ! "$python_bin" tools/validate_deploy.py "$DEPLOY"; then
        fail "$DEPLOY cross-checks failed (see above)"
    fi
else
    banner "WARNING: no python3: deploy/ cross-checks are SKIPPED."
fi

if [ "$failures" -gt 0 ]; then
    banner "$DEPLOY is INVALID: $failures check(s) failed (errors above)."
    exit 1
fi
echo "$DEPLOY: valid"
