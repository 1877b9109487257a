"""Benchmark: the daemon with the three built-in consumers, idle (issue #26's footprint rows).

    python -m bench.daemon [--windows 3] [--window 60] [--files 10000] [--md out.md]

``python -m reloadd run`` on the demo's configuration (registry-mirrors, containerd-images, kube-manifests with
its drift source and ``kube-watch``; a private containerd 1.6, a local registry, kube-apiserver v1.20.2), with
the demo's samples in the folders (one image tarball, one mirror drop-in, one manifest). After the start-up pass
and 20 s of quiet, each window reads the process's CPU time (utime + stime, ``/proc/<pid>/stat``) and VmRSS.
Then ``--files`` more files (empty YAML documents: recorded and watched, nothing to apply) are added to the
manifests folder and the same is measured again. There is no peer: the figures are held against the targets
(RSS ≤ 48 MiB, ≤ 56 MiB with 10,000 watched files, CPU ≤ 0.1 % of a core). Medians of the windows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from examples.demo.run_demo import _free_port, make_samples, write_config
from tests.infra import local_registry, private_containerd
from tests.kube.apiserver import KubeCluster


def _stat(pid: int) -> tuple[float, int]:
    """CPU seconds and threads of ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[17])


def _mem(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


async def _until(check: Any, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.5)


async def _measure(pid: int, windows: int, window: float, label: str) -> list[dict[str, Any]]:
    await asyncio.sleep(20)  # the start-up pass's heap is given back after a second of idleness
    rows = []
    for i in range(windows):
        cpu0, _ = _stat(pid)
        t0 = time.monotonic()
        await asyncio.sleep(window)
        cpu1, threads = _stat(pid)
        mem = _mem(pid)
        rows.append({"label": label, "window": i + 1, "cpu_s": cpu1 - cpu0,
                     "cpu_pct": 100 * (cpu1 - cpu0) / (time.monotonic() - t0), "rss": mem["VmRSS"],
                     "hwm": mem["VmHWM"], "threads": threads})
        print(f"[{time.strftime('%H:%M:%S')}] {label} window {i + 1}: CPU {rows[-1]['cpu_pct']:.3f} %, "
              f"RSS {mem['VmRSS']:.1f} MiB", flush=True)
    return rows


async def _run(args: argparse.Namespace) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="reloadd-bench-daemon-", dir="/tmp"))
    rows: list[dict[str, Any]] = []
    proc: asyncio.subprocess.Process | None = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            reg = await stack.enter_async_context(local_registry(root))
            ctd = await stack.enter_async_context(private_containerd(root, hosts_dir=root / "certs.d"))
            kube = stack.enter_context(KubeCluster(controllers=()))
            folders = root / "folders"
            for sub in ("images", "registries.conf.d", "manifests"):
                (folders / sub).mkdir(parents=True)
            samples = await make_samples(root, reg.host)
            shutil.copy(samples / "hello.tar", folders / "images")
            shutil.copy(samples / "50-demo-mirror.conf", folders / "registries.conf.d")
            shutil.copy(samples / "hello.yaml", folders / "manifests")
            port = _free_port()
            cfg = write_config(root, folders, ctd.address, kube.kubeconfig, port)
            log = stack.enter_context(open(root / "reloadd.log", "ab"))
            for files in (0, args.files):
                for i in range(files):
                    (folders / "manifests" / f"empty-{i:05d}.yaml").write_text("---\n")
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "reloadd", "run", "--config", str(cfg),
                    stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
                await _until(lambda p=port: _ready(p), "reloadd to be ready")
                label = "three consumers" + (f" + {files:,} watched files" if files else "")
                rows += await _measure(proc.pid, args.windows, args.window, label)
                proc.terminate()
                await proc.wait()
                proc = None
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        shutil.rmtree(root, ignore_errors=True)
    return rows


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "## Daemon idle footprint (issue #26)",
        "",
        "`python -m bench.daemon`: `reloadd run` with the three built-in consumers on the demo's configuration "
        "(a private containerd 1.6, a local registry, kube-apiserver v1.20.2; kube-manifests with its drift "
        "source), idle after its start-up pass. Then the same with "
        f"{args.files:,} more watched files (empty manifests). {args.windows} windows of {args.window:.0f} s each; "
        "CPU is utime + stime of the process over the window.",
        "",
        "| setting | window | CPU s | CPU % of a core | VmRSS MiB | VmHWM MiB | threads |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['label']} | {r['window']} | {r['cpu_s']:.2f} | {r['cpu_pct']:.3f} | {r['rss']:.1f} | "
              f"{r['hwm']:.1f} | {r['threads']} |" for r in rows]
    lines += ["", "| figure | median | target | |", "|---|---|---|---|"]
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = [r for r in rows if r["label"] == label]
        rss = statistics.median(r["rss"] for r in mine)
        cpu = statistics.median(r["cpu_pct"] for r in mine)
        limit = 56.0 if "watched" in label else 48.0
        verdict = "met" if rss <= limit else "**not met**"
        lines.append(f"| {label}: RSS | {rss:.1f} MiB | ≤ {limit:.0f} MiB | {verdict} |")
        lines.append(f"| {label}: CPU | {cpu:.3f} % | ≤ 0.1 % | {'met' if cpu <= 0.1 else '**not met**'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    rows = asyncio.run(_run(args))
    text = report(rows, args)
    print(text)
    if args.md is not None:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
