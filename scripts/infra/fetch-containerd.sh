#!/usr/bin/env bash
# Fetch the containerd releases that nodes run today besides Debian 12's own 1.6.x:
# Debian trixie's `containerd` (1.7.x) and sid's (2.x), extracted (never installed) into a cache.
#
#   OUT=/var/cache/reloadd/containerd bash scripts/infra/fetch-containerd.sh [SUITE...]
#
# Result: $OUT/<suite>/bin/{containerd,ctr,containerd-shim-runc-v2} and $OUT/<suite>/VERSION.
# The apt sources are derived from the machine's own configured Debian source lines with only the
# suite name changed (no host is written here); apt checks the archive signatures as usual.
# Idempotent: a suite whose binaries are cached and run is not fetched again.
set -euo pipefail

OUT=${OUT:-/var/cache/reloadd/containerd}
SUITES=("$@")
[ "${#SUITES[@]}" -gt 0 ] || SUITES=(trixie sid)
BINARIES=(containerd ctr containerd-shim-runc-v2)

cached_ok() {
  local d=$OUT/$1 b
  for b in "${BINARIES[@]}"; do [ -x "$d/bin/$b" ] || return 1; done
  "$d/bin/containerd" --version >/dev/null 2>&1 && [ -s "$d/VERSION" ]
}

missing=()
for s in "${SUITES[@]}"; do
  if cached_ok "$s"; then
    echo "containerd $(cat "$OUT/$s/VERSION") ($s) cached in $OUT/$s"
  else
    missing+=("$s")
  fi
done
[ "${#missing[@]}" -gt 0 ] || exit 0

WORK=$(mktemp -d "${TMPDIR:-/tmp}/reloadd-containerd.XXXXXX")
chmod 0755 "$WORK"  # apt downloads as user _apt
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT
mkdir -p "$WORK/lists/partial" "$WORK/cache/archives/partial" "$WORK/parts"

# The machine's main Debian archive lines (not -security/-updates), with the suite replaced.
src_sources() {  # $1 = suite
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    awk -v suite="$1" 'BEGIN { RS = ""; ORS = "\n\n" }
      /Types:[^\n]*deb/ && !/debian-security/ {
        out = ""; n = split($0, lines, "\n")
        for (i = 1; i <= n; i++) {
          if (lines[i] ~ /^Suites:/) lines[i] = "Suites: " suite
          if (lines[i] ~ /^Types:/) lines[i] = "Types: deb"
          out = out lines[i] "\n"
        }
        print out
      }' /etc/apt/sources.list.d/debian.sources > "$WORK/parts/$1.sources"
  elif [ -f /etc/apt/sources.list ]; then
    # one-line format: deb [opts] URI SUITE COMPONENTS...; keep the first archive line only
    awk -v suite="$1" '$1 == "deb" && $0 !~ /security/ && $0 !~ /-updates|-backports/ {
        i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
        $(i + 1) = suite; print; exit }' /etc/apt/sources.list > "$WORK/parts/$1.list"
  else
    echo "fetch-containerd.sh: no Debian apt sources found on this machine" >&2
    exit 1
  fi
  if [ ! -s "$WORK/parts/$1".* ]; then
    echo "fetch-containerd.sh: could not derive a $1 source line from this machine's apt sources" >&2
    exit 1
  fi
}

for s in "${missing[@]}"; do src_sources "$s"; done
APT=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$WORK/parts"
     -o Dir::State::Lists="$WORK/lists" -o Dir::Cache="$WORK/cache"
     -o Dir::State::status=/dev/null -o APT::Get::List-Cleanup=0 -o APT::Sandbox::User=root)
apt-get "${APT[@]}" update -qq

for s in "${missing[@]}"; do
  ver=$(apt-cache "${APT[@]}" madison containerd | awk -F'|' -v s="$s" '$3 ~ " "s"/" { gsub(/ /, "", $2); print $2; exit }')
  if [ -z "$ver" ]; then
    echo "fetch-containerd.sh: Debian $s has no containerd package" >&2
    exit 1
  fi
  echo "fetching containerd $ver ($s)"
  (cd "$WORK" && apt-get "${APT[@]}" download -qq "containerd=$ver")
  deb=$(ls "$WORK"/containerd_*.deb)
  x="$WORK/x-$s"
  dpkg-deb -x "$deb" "$x"
  rm -f "$deb"
  # Install atomically: a half-copied cache must never look valid.
  tmp="$OUT/.$s.tmp"
  rm -rf "$tmp" && mkdir -p "$tmp/bin"
  for b in "${BINARIES[@]}"; do install -m 0755 "$x/usr/bin/$b" "$tmp/bin/$b"; done
  "$tmp/bin/containerd" --version | awk '{ print $3 }' > "$tmp/VERSION"
  echo "$ver" > "$tmp/DEBIAN_VERSION"
  rm -rf "${OUT:?}/$s" && mv "$tmp" "$OUT/$s"
  echo "containerd $(cat "$OUT/$s/VERSION") ($s) installed in $OUT/$s"
done
