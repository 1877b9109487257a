"""Write→batch latency of a single file: reloadd and watchfiles watching the same directory.

Both watchers run in their own process on the same directory. The writer rewrites one
file (truncate, write, close), stamps CLOCK_MONOTONIC after ``close()``, and waits until
*both* reported the file in a batch (each child stamps CLOCK_MONOTONIC first thing in its
callback) before sleeping a random 10–100 ms and writing again. Every write therefore
hits both watchers at the same moment, on the same (noisy, shared) machine.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from ._proc import Watcher, probe_ready, summary, write_file

SETTINGS: dict[str, dict[str, Any]] = {
    "matched": {
        "title": "matched: reloadd quiet=50ms max_delay=1.6s; watchfiles step=50 debounce=1600",
        "reloadd": ["--quiet", "0.05", "--max-delay", "1.6"],
        "watchfiles": ["--step", "50", "--debounce", "1600"],
    },
    "defaults": {
        "title": "defaults: reloadd quiet=50ms max_delay=5s; watchfiles step=50 debounce=1600 (its defaults)",
        "reloadd": [],
        "watchfiles": [],
    },
}


def _await_write(w: Watcher, t0: float, start: int, timeout: float = 10.0) -> tuple[int, float] | None:
    """(index, stamp) of ``w``'s first batch naming the file stamped after ``t0``; None on timeout."""
    found: list[tuple[int, float]] = []

    def hit() -> bool:
        r = w.first_batch_with("config.yaml", t0, start)
        if r is not None:
            found.append((r[0], r[1].t))
        return r is not None

    w.wait(hit, timeout)
    return found[0] if found else None


def run(base: Path, setting: str, writes: int, seed: int = 1) -> dict[str, Any]:
    """Measure ``writes`` single-file writes under ``SETTINGS[setting]``."""
    cfg = SETTINGS[setting]
    root = base / f"latency-{setting}" / "watched"
    state = base / f"latency-{setting}" / "state"
    root.mkdir(parents=True)
    rng = random.Random(seed)
    log = base / f"latency-{setting}.log"
    watchers = [
        Watcher.start("reloadd", "reloadd", root, log, "--state", str(state), *cfg["reloadd"]),
        Watcher.start("watchfiles", "watchfiles", root, log, *cfg["watchfiles"]),
    ]
    lat: dict[str, list[float]] = {w.label: [] for w in watchers}
    extra: dict[str, int] = {w.label: 0 for w in watchers}
    missed: dict[str, int] = {w.label: 0 for w in watchers}
    target = root / "config.yaml"
    started = time.monotonic()
    try:
        probe_ready(root, watchers)
        write_file(target, b"warm-up\n")  # first sight of the file (ADDED) is not measured
        for w in watchers:
            w.wait_seen("config.yaml", 10)
        time.sleep(0.3)
        cursor = {w.label: len(w.batches) for w in watchers}
        for i in range(writes):
            time.sleep(rng.uniform(0.010, 0.100))
            for w in watchers:  # batches naming the file since the last measured one: extra batches
                with w.cond:
                    extra[w.label] += sum("config.yaml" in b.names for b in w.batches[cursor[w.label]:])
                    cursor[w.label] = len(w.batches)
            t0 = write_file(target, f"write {i} at {time.monotonic_ns()}\n".encode())
            for w in watchers:
                r = _await_write(w, t0, cursor[w.label])
                if r is not None:
                    idx, t = r
                    lat[w.label].append(t - t0)
                    cursor[w.label] = idx + 1
                else:
                    missed[w.label] += 1
    finally:
        for w in watchers:
            w.stop()
    return {
        "setting": setting,
        "title": cfg["title"],
        "writes": writes,
        "seconds": time.monotonic() - started,
        "watchers": {
            label: {**summary(values), "missed": missed[label], "extra_batches": extra[label]}
            for label, values in lat.items()
        },
    }
