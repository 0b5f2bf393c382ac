#!/usr/bin/env bash
# Certificates for tests of TLS with client certificates (etcd's
# --client-cert-auth): a CA, a server certificate for the given addresses, a
# client certificate from the same CA, and a "stranger" client certificate
# from another CA that the servers do not trust. Valid for one day.
#
#   tests/support/make_test_certs.sh DIR 127.0.0.1 [10.213.0.1 ...]
#   -> DIR/ca.pem, DIR/server.pem, DIR/server.key, DIR/client.pem, DIR/client.key,
#      DIR/stranger.pem, DIR/stranger.key
set -euo pipefail
dir=${1:?usage: make_test_certs.sh DIR ADDRESS...}
shift
[ $# -gt 0 ] || { echo "make_test_certs.sh: no server address given" >&2; exit 2; }
mkdir -p "$dir"
cd "$dir"
san=""
for address in "$@"; do san+="${san:+,}IP:$address"; done

ca() {  # NAME CN
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=$2" -keyout "$1.key" -out "$1.pem" 2>/dev/null
}
signed() {  # NAME CN CA EXTENSIONS
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$2" -keyout "$1.key" -out "$1.csr" 2>/dev/null
  printf '%s\n' "$4" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial -days 1 -extfile "$1.ext" \
    -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
ca ca lockstep-test-ca
ca other-ca someone-else
signed server lockstep-test-server ca "subjectAltName=$san
extendedKeyUsage=serverAuth,clientAuth"
signed client lockstep-test-client ca "extendedKeyUsage=clientAuth"
signed stranger stranger other-ca "extendedKeyUsage=clientAuth"
chmod 600 ./*.key
