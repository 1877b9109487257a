"""Bursts of files created as fast as possible, idle cost afterwards, and memory.

Fresh watcher processes (each at its defaults) watch a fresh, empty directory. The
writer creates ``n`` small files in it as fast as Python can (open, write, close: three
inotify events each), then waits until each watcher has reported every file, or has been
silent long enough (reloadd: 45 s, three of its 15 s periodic rescans; watchfiles:
10 s, since it never rescans). Counted per watcher: batches, distinct files delivered,
time from the first create to the last delivery, CPU seconds spent, peak and current RSS.

With those watchers still running and the files still present, :func:`idle` then
measures CPU seconds and context switches over a quiet interval.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ._proc import Watcher, context_switches, cpu_seconds, memory_kib, probe_ready

SILENCE = {"reloadd": 45.0, "watchfiles": 10.0}
CAP = 300.0


def start_watchers(base: Path, tag: str) -> tuple[Path, list[Watcher]]:
    """A fresh watched directory and both watchers on it, at their defaults, armed."""
    root = base / tag / "watched"
    state = base / tag / "state"
    root.mkdir(parents=True)
    log = base / f"{tag}.log"
    watchers = [
        Watcher.start("reloadd", "reloadd", root, log, "--state", str(state)),
        Watcher.start("watchfiles", "watchfiles", root, log),
    ]
    try:
        probe_ready(root, watchers)
    except Exception:
        for w in watchers:
            w.stop()
        raise
    return root, watchers


IDLE_FLOOR = "Python floor"
"""The idle windows' third process (``bench.core._child idlefloor``): what reloadd's idle duty costs at least."""


def start_idle_floor(base: Path, root: Path) -> Watcher:
    """The idle floor on ``root``, started (its first pass comes 15 s later, inside the first window)."""
    return Watcher.start(IDLE_FLOOR, "idlefloor", root, base / "idle-floor.log")


def create(root: Path, n: int) -> tuple[float, float]:
    """Create ``f000000`` … in ``root`` as fast as possible; return (start, end) monotonic."""
    payload = b"x" * 64
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    t0 = time.monotonic()
    for i in range(n):
        fd = os.open(root / f"f{i:06d}", flags, 0o644)
        os.write(fd, payload)
        os.close(fd)
    return t0, time.monotonic()


def burst(root: Path, watchers: list[Watcher], n: int) -> dict[str, Any]:
    """Create ``n`` files and follow both watchers until complete or silent."""
    names = {f"f{i:06d}" for i in range(n)}
    cpu0 = {w.label: cpu_seconds(w.pid) for w in watchers}
    b0 = {w.label: len(w.batches) for w in watchers}
    t0, t1 = create(root, n)
    done: dict[str, float] = {}
    while len(done) < len(watchers) and time.monotonic() - t1 < CAP:
        time.sleep(0.2)
        now = time.monotonic()
        for w in watchers:
            if w.label in done:
                continue
            with w.cond:
                got = sum(1 for k in names if k in w.first_seen) if len(w.first_seen) >= n else -1
                last = w.batches[-1].t if len(w.batches) > b0[w.label] else t1
            if got == n or now - max(last, t1) > SILENCE[w.kind] or w.proc.poll() is not None:
                done[w.label] = now
    out: dict[str, Any] = {"files": n, "create_seconds": t1 - t0, "watchers": {}}
    for w in watchers:
        with w.cond:
            new = w.batches[b0[w.label]:]
            delivered = {k for b in new for k in b.names if k in names}
            total = sum(1 for b in new for k in b.names if k in names)
            first_t = min((b.t for b in new if any(k in names for k in b.names)), default=float("nan"))
            last_t = max((b.t for b in new if any(k in names for k in b.names)), default=float("nan"))
        out["watchers"][w.label] = {
            "batches": len(new),
            "delivered": len(delivered),
            "completeness": len(delivered) / n,
            "duplicates": total - len(delivered),
            "first_delivery_s": first_t - t0,
            "last_delivery_s": last_t - t0,
            "cpu_s": cpu_seconds(w.pid) - cpu0[w.label],
            **{k.lower(): v for k, v in memory_kib(w.pid).items()},
            "engine": w.ask_stats(),
        }
    return out


def idle(watchers: list[Watcher], seconds: float) -> dict[str, Any]:
    """CPU seconds and context switches of each watcher over ``seconds`` of no changes."""
    before = {w.label: (cpu_seconds(w.pid), context_switches(w.pid), len(w.batches)) for w in watchers}
    time.sleep(seconds)
    out: dict[str, Any] = {"seconds": seconds, "watchers": {}}
    for w in watchers:
        cpu, (vol, invol), nb = before[w.label]
        vol2, invol2 = context_switches(w.pid)
        used = cpu_seconds(w.pid) - cpu
        out["watchers"][w.label] = {
            "cpu_s": used,
            "cpu_pct": 100.0 * used / seconds,
            "wakeups_per_s": (vol2 - vol) / seconds,
            "involuntary_per_s": (invol2 - invol) / seconds,
            "batches": len(w.batches) - nb,
            "threads": memory_kib(w.pid).get("Threads", 0),
        }
    return out
