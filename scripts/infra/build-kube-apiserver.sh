#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager, kube-scheduler and the kubelet v1.20.2 for reloadd's
# integration tests (the kubelet and scheduler make the test bed a real node: they run what reloadd delivered).
#
# Source: Debian bookworm's `kubernetes` SOURCE package (the full upstream tree, vendor/ included),
# compiled with Debian's Go. Only Debian's package registry is used, through apt-get.
#
#   OUT=/var/cache/reloadd/kube-v1.20.2 bash scripts/infra/build-kube-apiserver.sh
#
# Idempotent: exits at once when $OUT already holds both binaries and they report v1.20.2.
# Takes ~10-13 min on 2 cores and ~2.5 GB of scratch space (in $TMPDIR, removed afterwards).
set -euo pipefail

OUT=${OUT:-/var/cache/reloadd/kube-v1.20.2}
VERSION=v1.20.2
SRC_PKG='kubernetes=1.20.5+really1.20.2-1.1+deb12u1'
ORIG_TARBALL=kubernetes_1.20.5+really1.20.2.orig.tar.gz
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet)

cached_ok() {
  local b
  for b in "${BINARIES[@]}"; do
    [ -x "$OUT/$b" ] || return 1
    "$OUT/$b" --version 2>/dev/null | grep -qx "Kubernetes $VERSION" || return 1
  done
}

if cached_ok; then
  echo "kube $VERSION binaries cached in $OUT"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "build-kube-apiserver.sh: needs root (apt-get install); run as root or fill $OUT yourself" >&2
  exit 1
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/reloadd-kube-build.XXXXXX")
chmod 0755 "$WORK"  # apt downloads as user _apt
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
echo "installing build dependencies"
apt-get update -qq
# golang-github-modern-go-reflect2-dev: replaces a vendored library that crashes under Go >= 1.18 (below).
apt-get install -y -qq --no-install-recommends \
  golang-go make rsync openssl ca-certificates golang-github-modern-go-reflect2-dev >/dev/null

# A private deb-src list derived from the machine's own Debian sources: no host name is written here.
mkdir -p "$WORK/apt/lists/partial" "$WORK/apt/parts"
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > "$WORK/apt/parts/src.sources"
elif [ -f /etc/apt/sources.list ]; then
  sed -n 's/^deb \(.*\)$/deb-src \1/p' /etc/apt/sources.list > "$WORK/apt/parts/src.list"
else
  echo "build-kube-apiserver.sh: no Debian apt sources found" >&2
  exit 1
fi
APT=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$WORK/apt/parts"
     -o Dir::State::Lists="$WORK/apt/lists" -o Dir::Cache::srcpkgcache="$WORK/apt/src.bin"
     -o Dir::Cache::pkgcache="$WORK/apt/pkg.bin")
apt-get "${APT[@]}" update -qq

cd "$WORK"
echo "downloading source package $SRC_PKG"
apt-get "${APT[@]}" source --download-only "$SRC_PKG"
tar xzf "$ORIG_TARBALL"
rm -f "$ORIG_TARBALL"
cd "kubernetes-${VERSION#v}"

# The vendored modern-go/reflect2 v1.0.1 makes a Go >= 1.18 build crash on the first request
# (fatal error in runtime.mapiternext); Debian's 1.0.2 has the fix (go_above_118.go).
R2=vendor/github.com/modern-go/reflect2
R2_SRC=/usr/share/gocode/src/github.com/modern-go/reflect2
rm -rf "$R2" && mkdir -p "$R2"
cp "$R2_SRC"/*.go "$R2"/
cp "$R2_SRC"/*.s "$R2"/ 2>/dev/null || true
rm -f "$R2"/*_test.go
sed -i 's#github.com/modern-go/reflect2 v1.0.1#github.com/modern-go/reflect2 v1.0.2#g' vendor/modules.txt go.mod

# The GOPATH layout debian/rules uses (a plain `go build -mod=vendor` wants go.mod updates).
export GOPATH="$PWD/.go" GOCACHE="$WORK/gocache" HOME="$WORK/home"
export CGO_ENABLED=0 GOPROXY=off GOFLAGS= GOLDFLAGS="-s -w"
export KUBE_GIT_VERSION=$VERSION KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20 KUBE_GIT_TREE_STATE=clean
mkdir -p .go/src/k8s.io "$HOME"
[ -L .go/src/k8s.io/kubernetes ] || ln -s ../../.. .go/src/k8s.io/kubernetes
echo "building ${BINARIES[*]} (several minutes)"
make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubelet"

# Install atomically so an interrupted copy never looks like a valid cache.
mkdir -p "$OUT"
for b in "${BINARIES[@]}"; do
  install -m 0755 "_output/local/bin/linux/amd64/$b" "$OUT/.$b.tmp"
  mv -f "$OUT/.$b.tmp" "$OUT/$b"
done
if ! cached_ok; then
  echo "build-kube-apiserver.sh: built binaries do not report Kubernetes $VERSION" >&2
  exit 1
fi
echo "kube $VERSION binaries installed in $OUT"
