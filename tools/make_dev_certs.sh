#!/usr/bin/env bash
# Makes the development certificates for deploy/: a private CA and, signed by it, one
# certificate per specd service, so the services talk TLS and the verifier and the drafters
# accept only clients holding a certificate of this CA (mutual TLS).
#
#   tools/make_dev_certs.sh [DIR]            (default: deploy/certs of this checkout)
#
# DIR/ca.crt, DIR/ca.key        the CA (the key stays here: no container mounts it)
# DIR/verifier/                 ca.crt, tls.crt, tls.key   SANs verifier, host.docker.internal,
#                                                          localhost, 127.0.0.1
# DIR/drafter/                  ca.crt, tls.crt, tls.key   SANs drafter, localhost, 127.0.0.1
# DIR/router/                   ca.crt, tls.crt, tls.key   SANs router, localhost, 127.0.0.1
#                               client.crt, client.key     the router's client certificate
#                                                          towards the verifier and drafters
# DIR/kubernetes/               ca.crt, tls.crt, tls.key   one certificate for every pod of
#                               deploy/k8s (the specd-tls Secret; see deploy/README.md)
#
# Each bundle directory is what one container mounts read-only at /etc/specd/tls. The
# server certificates can also act as client certificates (both extended key usages), so a
# service's health check can present its own certificate to its own mTLS port.
#
# Idempotent: a file that exists and is still good is kept. A certificate is made again when
# it is missing, was not signed by the current CA, expires within 30 days, or its names
# changed; the CA itself only when it is missing or expires within 30 days (which remakes
# every certificate). Prints what it made and what it kept.
#
# Environment:
#   SPECD_NAMESPACE      Kubernetes namespace in the kubernetes/ names (default specd)
#   SPECD_CLUSTER_DOMAIN cluster DNS domain (default cluster.local)
#   SPECD_CERT_DAYS      validity of the service certificates in days (default 365)
#   SPECD_CERTS_OWNER    uid:gid to own the bundles (needs root), e.g. 10001:10001, the user
#                        the images run as; the keys are then readable by that owner alone.
#                        Unset, the bundle keys are left readable by every local user, so that
#                        the containers (user 10001) can read them through the bind mount.
#
# These certificates are for development and testing. In production take them from your
# PKI (e.g. cert-manager, see deploy/README.md).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$root/deploy/certs}
NAMESPACE=${SPECD_NAMESPACE:-specd}
DOMAIN=${SPECD_CLUSTER_DOMAIN:-cluster.local}
DAYS=${SPECD_CERT_DAYS:-365}
CA_DAYS=3650
# Remake a certificate that expires within this many seconds (30 days).
RENEW_SECONDS=2592000
OWNER=${SPECD_CERTS_OWNER:-}

command -v openssl >/dev/null 2>&1 || { echo "make_dev_certs: openssl is required" >&2; exit 1; }

mkdir -p "$DIR/.names"
DIR=$(cd "$DIR" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
umask 022

made=()
kept=()

new_key() {
    # ECDSA P-256 in PKCS#8, which every TLS stack specd may use reads.
    (umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null)
}

serial() {
    echo "0x$(openssl rand -hex 16)"
}

# Succeeds when the certificate exists and is valid for another RENEW_SECONDS.
fresh() {
    [ -s "$1" ] && openssl x509 -in "$1" -noout -checkend "$RENEW_SECONDS" >/dev/null 2>&1
}

make_ca() {
    cat >"$tmp/ca.cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
x509_extensions = v3_ca
[dn]
CN = specd development CA
O = specd
[v3_ca]
basicConstraints = critical, CA:true, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EOF
    new_key "$DIR/ca.key"
    openssl req -new -x509 -config "$tmp/ca.cnf" -key "$DIR/ca.key" -sha256 \
        -days "$CA_DAYS" -set_serial "$(serial)" -out "$DIR/ca.crt"
    chmod 600 "$DIR/ca.key"
    made+=("$DIR/ca.crt (CA, $CA_DAYS days)")
}

# issue BUNDLE NAME CN EKU SANS: BUNDLE/NAME.crt and BUNDLE/NAME.key signed by the CA. SANS
# (a subjectAltName value, may be empty) is recorded in DIR/.names, outside the bundles
# (which become Secrets and mounts), so that a change of names is noticed on the next run.
issue() {
    local bundle=$1 name=$2 cn=$3 eku=$4 sans=$5
    local crt="$bundle/$name.crt" key="$bundle/$name.key"
    local record="$DIR/.names/$(basename "$bundle")-$name"
    if fresh "$crt" && [ -s "$key" ] && [ "$(cat "$record" 2>/dev/null)" = "$eku;$sans" ] \
        && openssl verify -CAfile "$DIR/ca.crt" "$crt" >/dev/null 2>&1; then
        kept+=("$crt")
        return 0
    fi
    {
        echo "[req]"
        echo "distinguished_name = dn"
        echo "prompt = no"
        echo "[dn]"
        echo "CN = $cn"
        echo "O = specd"
        echo "[leaf]"
        echo "basicConstraints = critical, CA:false"
        echo "keyUsage = critical, digitalSignature"
        echo "extendedKeyUsage = $eku"
        echo "subjectKeyIdentifier = hash"
        echo "authorityKeyIdentifier = keyid"
        [ -z "$sans" ] || echo "subjectAltName = $sans"
    } >"$tmp/$name.cnf"
    new_key "$key"
    openssl req -new -config "$tmp/$name.cnf" -key "$key" -out "$tmp/$name.csr"
    openssl x509 -req -in "$tmp/$name.csr" -CA "$DIR/ca.crt" -CAkey "$DIR/ca.key" \
        -set_serial "$(serial)" -days "$DAYS" -sha256 \
        -extfile "$tmp/$name.cnf" -extensions leaf -out "$crt" 2>/dev/null
    openssl verify -CAfile "$DIR/ca.crt" "$crt" >/dev/null
    echo "$eku;$sans" >"$record"
    made+=("$crt (CN=$cn; $eku${sans:+; $sans})")
}

# The DNS names of a Kubernetes Service: short, namespaced and fully qualified.
k8s_names() {
    local service
    for service in "$@"; do
        printf 'DNS:%s,DNS:%s.%s,DNS:%s.%s.svc,DNS:%s.%s.svc.%s,' \
            "$service" "$service" "$NAMESPACE" "$service" "$NAMESPACE" \
            "$service" "$NAMESPACE" "$DOMAIN"
    done
}

if fresh "$DIR/ca.crt" && [ -s "$DIR/ca.key" ]; then
    kept+=("$DIR/ca.crt (CA)")
else
    make_ca
fi

server="serverAuth, clientAuth"
local_names="DNS:localhost,IP:127.0.0.1"
for service in verifier drafter router kubernetes; do
    mkdir -p "$DIR/$service"
    cp "$DIR/ca.crt" "$DIR/$service/ca.crt"
done
# host.docker.internal: a verifier run on the host (Metal, CUDA) with this certificate, which
# the compose router reaches under that name (deploy/README.md).
issue "$DIR/verifier" tls specd-verifier "$server" "DNS:verifier,DNS:host.docker.internal,$local_names"
issue "$DIR/drafter" tls specd-drafter "$server" "DNS:drafter,$local_names"
issue "$DIR/router" tls specd-router "$server" "DNS:router,$local_names"
issue "$DIR/router" client specd-router "clientAuth" ""
# One certificate for every pod: the Services' names, every verifier pod's own name under
# the headless Service, and the loopback address the exec probes use.
issue "$DIR/kubernetes" tls specd \
    "$server" \
    "$(k8s_names specd-router specd-verifier specd-verifier-pods specd-drafters)DNS:*.specd-verifier-pods.$NAMESPACE.svc.$DOMAIN,$local_names"

for service in verifier drafter router kubernetes; do
    chmod 755 "$DIR/$service"
    chmod 644 "$DIR/$service"/*.crt
    if [ -n "$OWNER" ]; then
        chown -R "$OWNER" "$DIR/$service"
        chmod 600 "$DIR/$service"/*.key
    else
        chmod 644 "$DIR/$service"/*.key
    fi
done

for item in "${made[@]}"; do
    echo "made  $item"
done
for item in "${kept[@]}"; do
    echo "kept  $item"
done
if [ -z "$OWNER" ]; then
    echo "note: the keys under $DIR/*/ are readable by every local user (the containers run as" \
        "user 10001); for private keys run as root with SPECD_CERTS_OWNER=10001:10001" >&2
fi
echo "clients: trust $DIR/ca.crt, e.g. curl --cacert $DIR/ca.crt https://localhost:8000/v1/models"
echo "kubernetes: kubectl -n $NAMESPACE create secret generic specd-tls --from-file=$DIR/kubernetes/"
