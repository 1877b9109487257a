#!/usr/bin/env bash
# Regenerate the committed protobuf + grpclib code of reloadd-containerd-images.
#
# The generator versions are pinned here and must move together with the runtime pin in
# pyproject.toml: protoc 35.1 (bundled in grpcio-tools 1.85.1) emits gencode that checks for
# protobuf >= 7.35.1 at import time. The tools live in a throw-away venv so nothing build-time
# leaks into the runtime environment. Output is byte-for-byte reproducible for a given pin.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$here/src"
pkg="reloadd_containerd_images/_proto"
GRPCIO_TOOLS="grpcio-tools==1.85.1"
GRPCLIB="grpclib==0.4.9"
PROTOBUF="protobuf==7.36.2"
PYTHON="${PYTHON:-python3}"

venv="${GEN_VENV:-$(mktemp -d)/venv}"
if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv "$venv"
  "$venv/bin/pip" install -q "$GRPCIO_TOOLS" "$GRPCLIB" "$PROTOBUF"
fi

cd "$src"
find "$pkg" \( -name '*_pb2.py' -o -name '*_pb2.pyi' -o -name '*_grpc.py' \) -delete
mapfile -t protos < <(find "$pkg" -name '*.proto' | LC_ALL=C sort)
# protoc-gen-grpclib_python must be on PATH.
PATH="$venv/bin:$PATH" "$venv/bin/python" -m grpc_tools.protoc -I. \
  --python_out=. --pyi_out=. --grpclib_python_out=. "${protos[@]}"
# The stubs and grpclib modules are generated, not ours to type-check (google.protobuf ships no
# types here); say so in each file so `mypy --strict` on the plugin stays about our code.
for f in $(find "$pkg" \( -name '*_pb2.pyi' -o -name '*_grpc.py' \) | LC_ALL=C sort); do
  { echo "# mypy: ignore-errors"; cat "$f"; } > "$f.tmp" && mv "$f.tmp" "$f"
done
# Every directory on the way becomes a regular package.
find "$pkg" -type d -exec sh -c 'test -f "$1/__init__.py" || : > "$1/__init__.py"' _ {} \;
echo "generated $(find "$pkg" -name '*_pb2.py' | wc -l) modules under $src/$pkg"
