"""The core benchmark suite: ``python -m bench [--quick]`` from the repository root.

Phases (full / ``--quick``):

1. latency: single-file write→batch, matched settings (400 / 100 writes) and defaults (300 / 100);
2. bursts: 10,000 and 100,000 files (quick: 10,000 only), 3 runs each with fresh watchers, with
   memory after each (the 100k figure is the peak RSS with 100k files watched and acknowledged);
3. idle: 3 windows of 60 s (quick: 15 s) right after the first 10,000-file burst, files present;
4. rescan: in-process ``Engine.reconcile``, full and covered, over 10,000 and 100,000
   acknowledged files (quick: 10,000), against a ``find -printf '%i %s %T@'`` walk of the same tree.

Every figure compared with a target is a median of at least 3 runs.

The results go to docs/benchmarks-core.md (``--out``) and optionally to JSON (``--json``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any

from . import burst, fastburst, latency, report, rescan
from ._proc import REPO

PHASES = ("latency", "burst", "idle", "rescan", "fastburst")

PLANS: dict[str, dict[str, Any]] = {
    "full": {"writes": {"matched": 400, "defaults": 300}, "bursts": [10_000, 100_000], "burst_reps": 3,
             "idle_s": 60.0, "idle_reps": 3, "rescan": [10_000, 100_000], "rescan_reps": 5,
             "fast": 100_000, "fast_reps": 3},
    "quick": {"writes": {"matched": 100, "defaults": 100}, "bursts": [10_000], "burst_reps": 3,
              "idle_s": 15.0, "idle_reps": 3, "rescan": [10_000], "rescan_reps": 3,
              "fast": 10_000, "fast_reps": 1},
}


def _fstype(path: Path) -> str:
    try:
        return subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", str(path)], capture_output=True,
                              text=True, check=True).stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine(base: Path, mode: str) -> dict[str, Any]:
    """Where and with what this run happens."""
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kib = next(int(x.split()[1]) for x in Path("/proc/meminfo").read_text().splitlines()
                   if x.startswith("MemTotal:"))
    ino = "/proc/sys/fs/inotify/"
    inotify = ", ".join(f"{k}={Path(ino + k).read_text().strip()}"
                        for k in ("max_queued_events", "max_user_watches", "max_user_instances"))
    versions = {}
    for dist in ("reloadd", "watchfiles", "asyncinotify", "anyio"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
        "mode": mode,
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "mem_gib": mem_kib / 1024 / 1024,
        "kernel": platform.release(),
        "base": str(base),
        "fstype": _fstype(base),
        "inotify": inotify,
        "load_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        "versions": versions,
    }


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def suite(base: Path, plan: dict[str, Any], only: set[str], data: dict[str, Any]) -> None:
    """Run the selected phases, filling ``data``; a failing phase is recorded, not fatal."""

    def attempt(name: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            _say(f"{name} failed: {exc}")
            traceback.print_exc()
            data["errors"].append(f"{name}: {type(exc).__name__}: {exc}")
            return None

    if "latency" in only:
        data["latency"] = []
        for setting, writes in plan["writes"].items():
            _say(f"latency ({setting}, {writes} writes)")
            r = attempt(f"latency {setting}", latency.run, base, setting, writes)
            if r is not None:
                data["latency"].append(r)
                _say("  " + ", ".join(f"{k} p50 {v['p50'] * 1000:.1f} ms p99 {v['p99'] * 1000:.1f} ms"
                                      for k, v in r["watchers"].items()))
    if only & {"burst", "idle"}:
        data["burst"] = []
        for n in plan["bursts"]:
            for rep in range(plan["burst_reps"]):
                _say(f"burst of {n:,} files, run {rep + 1} of {plan['burst_reps']}")
                try:
                    root, watchers = burst.start_watchers(base, f"burst{n}-{rep}")
                except Exception as exc:
                    data["errors"].append(f"burst {n}: {type(exc).__name__}: {exc}")
                    continue
                try:
                    r = attempt(f"burst {n}", burst.burst, root, watchers, n)
                    if r is not None:
                        data["burst"].append({**r, "run": rep + 1})
                        _say("  " + ", ".join(f"{k} {v['delivered']:,} delivered, last at "
                                              f"{v['last_delivery_s']:.1f} s, CPU {v['cpu_s']:.1f} s"
                                              for k, v in r["watchers"].items()))
                    if n == plan["bursts"][0] and rep == 0 and "idle" in only:
                        _say(f"idle: {plan['idle_reps']} windows of {plan['idle_s']:.0f} s with {n:,} files")
                        time.sleep(3)  # let the last state flush and thread hand-offs finish
                        floor = burst.start_idle_floor(base, root)
                        try:
                            windows = [attempt("idle", burst.idle, [*watchers, floor], plan["idle_s"])
                                       for _ in range(plan["idle_reps"])]
                        finally:
                            floor.stop()
                        if all(w is not None for w in windows):
                            data["idle"] = {"files": n, "windows": windows}
                finally:
                    for w in watchers:
                        w.stop()
    if "rescan" in only:
        data["rescan"] = []
        for n in plan["rescan"]:
            root = base / f"burst{n}-0" / "watched"
            if not root.is_dir() or sum(1 for _ in root.iterdir()) < n:
                root = base / f"tree{n}"
                root.mkdir(parents=True, exist_ok=True)
                burst.create(root, n)
            _say(f"rescan of {n:,} files")
            r = attempt(f"rescan {n}", rescan.run, root, base / f"rescan{n}-state", plan["rescan_reps"])
            if r is not None:
                data["rescan"].append(r)
                _say(f"  full: cpu p50 {r['cpu']['p50'] * 1000:.0f} ms, wall p50 {r['wall']['p50'] * 1000:.0f} ms, "
                     f"find CPU p50 {r['find_cpu']['p50'] * 1000:.0f} ms, initial sync {r['initial_sync_s']:.1f} s; "
                     f"covered: cpu p50 {r['covered']['cpu']['p50'] * 1000:.0f} ms")


    if "fastburst" in only:
        data["fastburst"] = []
        for rep in range(plan["fast_reps"]):
            _say(f"fast writer: modify, create and delete bursts of {plan['fast']:,} files, run {rep + 1}")
            r = attempt("fastburst", fastburst.run, base, plan["fast"], rep)
            for one in r or []:
                data["fastburst"].append({**one, "run": rep + 1})
                _say(f"  {one['mode']}: " + ", ".join(
                    f"{k} {v['delivered']:,} delivered, last at {v['last_delivery_s']:.1f} s, CPU {v['cpu_s']:.1f} s"
                    for k, v in one["watchers"].items()))


def main(argv: list[str] | None = None) -> int:
    """Run the suite and write the report."""
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="about 2 minutes instead of 10-15")
    ap.add_argument("--only", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks-core.md")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    a = ap.parse_args(argv)
    only = {p.strip() for p in a.only.split(",") if p.strip()}
    if only - set(PHASES):
        ap.error(f"unknown phase(s): {sorted(only - set(PHASES))}")
    mode = "quick" if a.quick else "full"
    base = Path(tempfile.mkdtemp(prefix="reloadd-bench-"))
    started = time.monotonic()
    data: dict[str, Any] = {"machine": machine(base, mode), "errors": []}
    _say(f"{mode} run in {base} ({data['machine']['fstype']})")
    try:
        suite(base, PLANS[mode], only, data)
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    data["machine"]["wall_s"] = time.monotonic() - started
    data["machine"]["load_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(report.render(data))
    if a.json:
        a.json.write_text(json.dumps(data, indent=1, default=str))
    _say(f"wrote {a.out} in {data['machine']['wall_s']:.0f} s")
    return 1 if data["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
