#!/usr/bin/env bash
# Install the Debian packages reloadd's tests, demo and benchmarks start for real:
# a private containerd, docker-registry and skopeo, etcd, mmdebstrap (the image), libfuse3 (the fault suite's
# EIO-on-write file system), chromium (the docs site's browser test opens every page headless), and what the test
# bed's node needs beside the kubelet (tests/kube/node.py): runc (containerd's runtime), the CNI plugins,
# busybox-static (the binary its sandbox and test images run) and iproute2 (its teardown deletes the CNI bridge).
# qemu-user-static with binfmt-support and arch-test (the image's arm64 root file system).
# Idempotent: installs only what is missing.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
for pkg in containerd docker-registry skopeo etcd-server openssl curl python3-venv vim nano rsync systemd mmdebstrap \
    libfuse3-3 fuse3 \
    chromium \
    runc containernetworking-plugins busybox-static iproute2 \
    qemu-user-static binfmt-support arch-test; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
  echo "installing: ${need[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# The packages start system-wide services; reloadd's tests never use them, so keep them off.
for svc in containerd docker-registry etcd; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
    systemctl stop "$svc" || true
  fi
done
