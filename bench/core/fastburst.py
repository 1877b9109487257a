"""Bursts from a writer in another process at full speed (issue #28): modify, create and delete.

100,000 files in 100 folders. Both watchers (each at its defaults, in its own process, counting
alike: one line per batch with the names it names) watch the tree; the files of the *modify* and
*delete* bursts exist before the watchers start (reloadd acknowledges them in its start-up pass).
A writer process then, as fast as it can, appends one byte to every file (*modify*), creates
100,000 new ones (*create*) or unlinks them again (*delete*). File names are unique across the
folders, so a name identifies a file.

Per burst and watcher: files delivered, time from the writer's first operation to the last
delivery, CPU seconds from the writer's start until following ends, and the watcher's resident
memory before the burst, at its peak and 30 s after following ended (memory given back).

*overflow* (run as root only): fresh watchers started while ``fs.inotify.max_queued_events`` is
lowered to :data:`OVERFLOW_QUEUE` (16 events) (the kernel reads it when an inotify instance is made; the old
value is put back at once), then the *create* burst into empty folders: the kernel queue overflows.
Every file must still be delivered, and reloadd's rescan must start within 100 ms of the overflow
(its engine measures ``recovery_delay``, from reading the overflow to the rescan's start).

*modify, Python floor*: the modify burst again, with the *floor* child in reloadd's place
(:func:`bench.core._child.run_floor`: the least Python code that reads the events, stats, reads and hashes
each changed file and journals it, as reloadd must) beside watchfiles: what the ratios to watchfiles cannot
go below in CPython with reloadd's guarantees, measured in the same run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ._proc import Watcher, cpu_seconds, memory_kib, probe_ready

FOLDERS = 100
SILENCE = {"reloadd": 45.0, "watchfiles": 10.0, "floor": 10.0}
CAP = 300.0
SETTLE_AFTER = 30.0  # seconds after following ends before the "after" memory is read
FLOOR_SUFFIX = ", Python floor"
"""Ends the label of a burst run with the Python floor in reloadd's place."""
OVERFLOW_QUEUE = 16  # fs.inotify.max_queued_events for the overflow burst's watchers
_QUEUED = Path("/proc/sys/fs/inotify/max_queued_events")

_WRITER = r"""
import json, os, sys, time
mode, root, first, n, folders = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
paths = [os.path.join(root, f"d{i % folders:02d}", f"f{i:06d}") for i in range(first, first + n)]
t0 = time.monotonic()
if mode == "modify":
    for p in paths:
        fd = os.open(p, os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"+")
        os.close(fd)
elif mode == "create":
    for p in paths:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"x")
        os.close(fd)
else:
    for p in paths:
        os.unlink(p)
print(json.dumps({"t0": t0, "t1": time.monotonic()}), flush=True)
"""


def names(first: int, n: int) -> set[str]:
    return {f"f{i:06d}" for i in range(first, first + n)}


def populate(root: Path, first: int, n: int) -> None:
    """Create the folders and files ``first`` … ``first + n - 1`` (before the watchers start)."""
    for d in range(FOLDERS):
        (root / f"d{d:02d}").mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", _WRITER, "create", str(root), str(first), str(n), str(FOLDERS)],
                   check=True, capture_output=True)


def start_watchers(base: Path, tag: str, n: int, first: str = "reloadd") -> tuple[Path, list[Watcher]]:
    """The tree with ``n`` files, and both watchers on it, armed (reloadd's start-up pass done); ``first`` is
    ``"floor"`` for the Python floor (:func:`bench.core._child.run_floor`) in reloadd's place."""
    root = base / tag / "watched"
    populate(root, 0, n)
    log = base / f"{tag}.log"
    watchers = [
        Watcher.start(first, first, root, log, "--state", str(base / tag / "state")),
        Watcher.start("watchfiles", "watchfiles", root, log),
    ]
    try:
        probe_ready(root, watchers)
    except Exception:
        for w in watchers:
            w.stop()
        raise
    return root, watchers


def burst(root: Path, watchers: list[Watcher], mode: str, first: int, n: int, label: str = "",
          settle: float | None = None) -> dict[str, Any]:
    """Run one writer burst and follow both watchers until complete or silent; the memory "after" is read
    ``settle`` seconds (default :data:`SETTLE_AFTER`) after following ends."""
    want = names(first, n)
    before = {w.label: memory_kib(w.pid) for w in watchers}
    cpu0 = {w.label: cpu_seconds(w.pid) for w in watchers}
    b0 = {w.label: len(w.batches) for w in watchers}
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", _WRITER, mode, str(root), str(first), str(n), str(FOLDERS)],
                         check=True, capture_output=True, text=True)
    stamps = json.loads(out.stdout)
    t0, t1 = stamps["t0"], stamps["t1"]
    done: dict[str, float] = {}
    got: dict[str, int] = {}
    while len(done) < len(watchers) and time.monotonic() - t1 < CAP:
        time.sleep(0.2)
        now = time.monotonic()
        for w in watchers:
            if w.label in done:
                continue
            with w.cond:
                new = w.batches[b0[w.label]:]
                seen = {k for b in new for k in b.names if k in want}
                last = new[-1].t if new else t1
            got[w.label] = len(seen)
            if len(seen) == n or now - max(last, t1) > SILENCE[w.kind] or w.proc.poll() is not None:
                done[w.label] = now
    cpu = {w.label: cpu_seconds(w.pid) - cpu0[w.label] for w in watchers}
    peak = {w.label: memory_kib(w.pid) for w in watchers}
    time.sleep(SETTLE_AFTER if settle is None else settle)
    result: dict[str, Any] = {"mode": label or mode, "files": n, "write_seconds": t1 - t0,
                              "writer_started_s": t0 - started, "watchers": {}}
    for w in watchers:
        with w.cond:
            new = [b for b in w.batches[b0[w.label]:] if any(k in want for k in b.names)]
        after = memory_kib(w.pid)
        result["watchers"][w.label] = {
            "batches": len(new),
            "delivered": len({k for b in new for k in b.names if k in want}),
            "first_delivery_s": min((b.t for b in new), default=float("nan")) - t0,
            "last_delivery_s": max((b.t for b in new), default=float("nan")) - t0,
            "cpu_s": cpu[w.label],
            "rss_before_kib": before[w.label].get("VmRSS", 0),
            "rss_peak_kib": peak[w.label].get("VmHWM", 0),
            "rss_end_kib": peak[w.label].get("VmRSS", 0),
            "rss_after_kib": after.get("VmRSS", 0),
            "engine": w.ask_stats(),
        }
    return result


def run(base: Path, n: int, rep: int) -> list[dict[str, Any]]:
    """One set of fresh watchers: a modify, a create and a delete burst of ``n`` files each."""
    root, watchers = start_watchers(base, f"fast{n}-{rep}", n)
    try:
        out = [
            burst(root, watchers, "modify", 0, n),
            burst(root, watchers, "create", n, n),
            burst(root, watchers, "delete", n, n),
        ]
    finally:
        for w in watchers:
            w.stop()
    root, watchers = start_watchers(base, f"floor{n}-{rep}", n, first="floor")
    try:
        out.append(burst(root, watchers, "modify", 0, n, label="modify" + FLOOR_SUFFIX, settle=1.0))
    finally:
        for w in watchers:
            w.stop()
    if os.access(_QUEUED, os.W_OK):
        old = _QUEUED.read_text().strip()
        _QUEUED.write_text(str(OVERFLOW_QUEUE))
        try:
            root, watchers = start_watchers(base, f"overflow{n}-{rep}", 0)
        finally:
            _QUEUED.write_text(old)  # read by the kernel when each watcher made its inotify instance
        try:
            out.append(burst(root, watchers, "create", 0, n, label="overflow"))
        finally:
            for w in watchers:
                w.stop()
    return out
