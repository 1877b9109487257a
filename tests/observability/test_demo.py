"""``make demo``: the smoke run does what the printed instructions say; Ctrl-C stops everything it started."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(240)


def processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry))
    return pids


async def test_demo_smoke_imports_mirrors_and_applies(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "examples.demo.run_demo", "--smoke", "--folders", str(tmp_path / "demo"),
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 200)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "smoke: docker.io/demo/hello:v1 imported into containerd" in text
    assert "smoke: docker.io/demo/hello:v2 pulled through the mirror" in text
    assert "smoke: manifests/hello.yaml applied" in text  # `make kube` has built the API server
    assert "cp " in text and "/images/" in text and "reloadd status --config" in text
    assert "smoke: OK" in text
    # `make kube` built the kubelet too: the air-gap flow on a real node, step by step in this order
    order = [
        "smoke: dropped images/hello.tar, registries.conf.d/50-demo-mirror.conf and manifests/hello.yaml together",
        "smoke: mirror written: ",
        "smoke: docker.io/demo/hello:v1 imported into containerd",
        "smoke: manifests/hello.yaml applied (Deployment default/hello)",
        "Running and Ready on node1 (docker.io/demo/hello:v1, never pulled)",
        "smoke: manifests/hello.yaml Current",
        "smoke: OK",
    ]
    at = [text.find(line) for line in order]
    assert all(i >= 0 for i in at) and at == sorted(at), text
    node_dir = re.search(r"ctr -a (/tmp/reloadd-node-[^/]+)/containerd.sock", text)
    assert node_dir is not None, text
    assert processes_mentioning(node_dir.group(1)) == []  # containerd, its shims, the kubelet: all gone
    assert not os.path.exists(node_dir.group(1))  # noqa: ASYNC240 - one stat after the demo exited


async def test_demo_without_kube_binaries_builds_in_background_then_applies(tmp_path: Path) -> None:
    """A fresh machine: images and mirrors work at once; manifests are switched on once the build is done."""
    real = Path(os.environ.get("RELOADD_KUBE_BIN") or "/var/cache/reloadd/kube-v1.20.2")
    assert (real / "kube-apiserver").exists(), "run `make kube` first"
    build = tmp_path / "build.sh"  # stands in for the 7-minute build: same contract ($OUT filled), 3 s
    build.write_text(f'set -e\nsleep 3\nmkdir -p "$OUT"\n'
                     f'cp {real}/kube-apiserver {real}/kube-controller-manager "$OUT"/\n')
    env = {**os.environ, "RELOADD_KUBE_BIN": str(tmp_path / "kube-bin"), "RELOADD_KUBE_BUILD": str(build)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "examples.demo.run_demo", "--smoke", "--folders", str(tmp_path / "demo"),
        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 200)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text
    order = [
        "building kube-apiserver v1.20.2 in the background",
        "smoke: docker.io/demo/hello:v1 imported into containerd",
        "kube-apiserver is ready: the manifests folder is on",
        "smoke: manifests/hello.yaml applied",
        "smoke: OK",
    ]
    at = [text.find(line) for line in order]
    assert all(i >= 0 for i in at) and at == sorted(at), text
    assert (tmp_path / "kube-bin" / "kube-apiserver").exists()


async def test_demo_ctrl_c_stops_everything_it_started(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "examples.demo.run_demo", "--no-kube", "--folders", str(tmp_path / "demo"),
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    work = None
    try:
        while True:
            line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode(errors="replace")
            assert line, "demo exited early:\n" + "".join(seen)
            seen.append(line)
            if m := re.search(r"work dir (\S+)\)", line):
                work = m.group(1)
            if "Ctrl-C stops everything" in line:
                break
        assert work is not None
        assert len(processes_mentioning(work)) >= 3  # containerd, docker-registry, reloadd
        proc.send_signal(signal.SIGINT)
        rest, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, "".join(seen) + rest.decode(errors="replace")
        assert processes_mentioning(work) == []
        assert not os.path.exists(work)  # noqa: ASYNC240 - one stat after the demo exited
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
