"""Benchmark: time from a registries.conf.d drop-in save to the new hosts.toml on disk.

    python -m bench.registry_mirrors [--saves 50] [--quiet 100ms] [--drop-ins 20] [--json out.json]

1. Through the real engine (inotify, the ``quiet`` settle window, the plugin loaded from its
   entry point): each save is an atomic temp-file rename of one drop-in switching its mirror
   between two ports; the clock stops when ``hosts_dir/<host>/hosts.toml`` holds the new
   mirror (polled every 0.5 ms). Reports median and p99, and the same minus ``quiet``.
2. The consumer alone (``handle()`` on one batch: re-read, validate, render and write every
   input), with ``--drop-ins`` other drop-ins present, median and p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from reloadd_registry_mirrors import create

from reloadd import (
    Batch,
    Change,
    ChangeKind,
    ConsumerContext,
    Fingerprint,
    Reason,
    Reloader,
    parse_config,
    parse_duration,
)

HOST = "registry.bench.invalid"


def conf(port: int, host: str = HOST) -> str:
    return (
        f'[[registry]]\nprefix = "{host}"\nlocation = "{host}"\n'
        f'[[registry.mirror]]\nlocation = "127.0.0.1:{port}"\ninsecure = true\n'
    )


def save(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def options(root: Path) -> dict[str, Any]:
    return {
        "registries_conf": str(root / "registries.conf"),
        "registries_conf_d": str(root / "registries.conf.d"),
        "hosts_dir": str(root / "certs.d"),
        "certs_dirs": [],
        "containerd_config": "",
    }


def populate(root: Path, n: int) -> None:
    d = root / "registries.conf.d"
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (d / f"10-other-{i:03d}.conf").write_text(conf(6000 + i, f"other{i}.bench.invalid"))


def wait_for_text(path: Path, needle: str, limit: float = 10.0) -> float:
    """Poll ``path`` (in a worker thread) until it contains ``needle``; the time it did."""
    deadline = time.perf_counter() + limit
    while True:
        try:
            if needle in path.read_text():
                return time.perf_counter()
        except FileNotFoundError:
            pass
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{path} never contained {needle!r}")
        time.sleep(0.0005)


async def engine_latency(root: Path, saves: int, quiet: str) -> list[float]:
    cfg = parse_config(
        {
            "reloadd": {"state_dir": str(root / "state"), "quiet": quiet, "max_delay": "2s"},
            "consumer": [{"name": "mirrors", "plugin": "registry-mirrors", "options": options(root)}],
        }
    )
    drop = root / "registries.conf.d" / "50-bench.conf"
    target = root / "certs.d" / HOST / "hosts.toml"
    out = []
    async with Reloader(cfg) as r:
        await r.wait_idle(30)
        for i in range(saves):
            port = 5000 + i % 2
            t0 = time.perf_counter()
            save(drop, conf(port))
            t1 = await asyncio.to_thread(wait_for_text, target, f"127.0.0.1:{port}")
            out.append(t1 - t0)
            await r.wait_idle(30)
    return out


async def consumer_latency(root: Path, saves: int) -> list[float]:
    ctx = ConsumerContext(name="mirrors", paths=(), options=options(root), state_dir=root / "state")
    consumer = create(ctx)
    drop = root / "registries.conf.d" / "50-bench.conf"
    out = []
    for i in range(saves):
        save(drop, conf(7000 + i % 2))
        change = Change(drop, ChangeKind.MODIFIED, Fingerprint.from_stat(drop.stat()))
        batch = Batch("mirrors", Reason.INOTIFY, (change,))
        t0 = time.perf_counter()
        await consumer.handle(batch)
        out.append(time.perf_counter() - t0)
    return out


def summary(name: str, values: list[float], offset: float = 0.0) -> dict[str, float]:
    ms = [(v - offset) * 1000 for v in values]
    row = {"median_ms": round(statistics.median(ms), 2), "p99_ms": round(p99(ms), 2), "n": len(ms)}
    print(f"{name:<52} median {row['median_ms']:8.2f} ms  p99 {row['p99_ms']:8.2f} ms  (n={len(ms)})")
    return row


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--saves", type=int, default=50)
    ap.add_argument("--quiet", default="100ms", help="the engine's settle window")
    ap.add_argument("--drop-ins", type=int, default=20, help="other drop-ins present while measuring")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path, help="write the docs/benchmarks.md section here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    quiet = parse_duration(args.quiet, "--quiet")
    results: dict[str, Any] = {"saves": args.saves, "quiet_s": quiet, "drop_ins": args.drop_ins}
    with tempfile.TemporaryDirectory(prefix="bench-mirrors-") as tmp:
        root = Path(tmp) / "engine"
        populate(root, args.drop_ins)
        lat = await engine_latency(root, args.saves, args.quiet)
        results["save_to_disk"] = summary(f"save -> hosts.toml on disk (engine, quiet={args.quiet})", lat)
        results["save_to_disk_minus_quiet"] = summary("  the same minus the quiet window", lat, quiet)
        root = Path(tmp) / "consumer"
        populate(root, args.drop_ins)
        results["handle"] = summary(
            f"consumer handle() alone ({args.drop_ins + 1} drop-ins)",
            await consumer_latency(root, args.saves),
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if args.md:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        rows = [
            f"## registry-mirrors ({when})",
            "",
            f"{args.saves} saves of one drop-in beside {args.drop_ins} others; no peer reloads hosts.toml live "
            "(CRI-O reloads its own registries.conf only).",
            "",
            "| measure | median | p99 |",
            "|---|---|---|",
        ]
        for key, label in (("save_to_disk", f"save → hosts.toml on disk (engine, quiet {args.quiet})"),
                           ("save_to_disk_minus_quiet", "the same minus the quiet window"),
                           ("handle", f"consumer handle() alone ({args.drop_ins + 1} drop-ins)")):
            rows.append(f"| {label} | {results[key]['median_ms']:.1f} ms | {results[key]['p99_ms']:.1f} ms |")
        args.md.write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
