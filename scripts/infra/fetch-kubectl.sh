#!/usr/bin/env bash
# kubectl from Debian's `kubernetes-client` package (v1.20.2, the same tree as the tests' kube-apiserver),
# extracted, never installed, into a cache: the peer the kube-manifests tests and benchmarks compare
# applies against. Extracting keeps it apart from any other kubectl the machine has on PATH.
#
#   OUT=/var/cache/reloadd/kubectl-v1.20.2 bash scripts/infra/fetch-kubectl.sh
#
# Idempotent: exits at once when $OUT/kubectl exists and reports v1.20.2.
set -euo pipefail

OUT=${OUT:-/var/cache/reloadd/kubectl-v1.20.2}
VERSION=v1.20.2

cached_ok() { [ -x "$OUT/kubectl" ] && "$OUT/kubectl" version --client --short 2>/dev/null | grep -q "$VERSION"; }
if cached_ok; then
  echo "kubectl $VERSION cached in $OUT"
  exit 0
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/reloadd-kubectl.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
if ! (cd "$WORK" && apt-get download -qq -o APT::Sandbox::User=root kubernetes-client 2>/dev/null); then
  apt-get update -qq
  (cd "$WORK" && apt-get download -qq -o APT::Sandbox::User=root kubernetes-client)
fi
dpkg-deb -x "$WORK"/kubernetes-client_*.deb "$WORK/x"
mkdir -p "$OUT"
install -m 0755 "$WORK/x/usr/bin/kubectl" "$OUT/.kubectl.tmp"
mv -f "$OUT/.kubectl.tmp" "$OUT/kubectl"
if ! cached_ok; then
  echo "fetch-kubectl.sh: $OUT/kubectl does not report $VERSION" >&2
  exit 1
fi
echo "kubectl $VERSION installed in $OUT"
