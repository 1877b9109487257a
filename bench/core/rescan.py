"""Cost of one periodic rescan, in process: ``Engine.reconcile(None, Reason.RESCAN)``.

A Reloader (rescans and inotify off, so nothing else runs) with an acknowledging consumer
first takes in every file of an existing tree through the real start-up pass (its wall
time is reported as "initial sync"). Then the rescan the 15 s timer would run is timed
directly, on the unchanged tree where every file is acknowledged: CPU (``process_time``,
all threads, since the walk runs in a worker thread) and wall time. A correct rescan
re-observes nothing, which is checked and reported. The peer is ``find`` printing inode,
size and mtime of every entry of the same tree: the cost of a stat walk in C. Each full
rescan is followed by one ``find``, one bare walk and one Python floor walk (interleaved pairs:
the figure is the median of the per-pair ratios, so a machine whose speed drifts during the
run moves both sides of each pair alike).

That is the *full* rescan (start-up, overflow, SIGHUP). The periodic rescans are
*covered*: with inotify on, a directory a live watch covers is listed only when its
names changed since its last listing, and its files are stat-ed only on its turn (a
quarter of the directories at the defaults, by directory inode, in turn).
They are timed the same way on a second Reloader with inotify on, each called as the
timer calls it (``periodic=True``).
"""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import stat
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reloadd import (
    BaseConsumer,
    Batch,
    ConsumerContext,
    EventKind,
    Reason,
    Reloader,
    Result,
    SourceEvent,
    parse_config,
)
from reloadd._pipeline._scan import scan

from ._proc import percentile, summary


class _AckAll(BaseConsumer):
    async def handle(self, batch: Batch) -> Mapping[Path, Result]:
        return {}


async def _measure(root: Path, state: Path, reps: int, covered: bool = False,
                   peers: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """Time ``reps`` rescans; with ``peers``, after each one (untimed) ``find``, a bare walk and the Python floor run
    once each and their CPU is appended to ``peers["find"]``, ``peers["walk"]`` and ``peers["floor"]``."""
    cfg = parse_config({"reloadd": {"state_dir": str(state), "inotify": covered, "rescan_interval": 0,
                                    "quiet": "50ms"}})
    consumer = _AckAll(ConsumerContext(name="bench", paths=(root,), options={}, state_dir=state / "c"))
    t0 = time.perf_counter()
    async with Reloader(cfg, consumers=[consumer]) as r:
        await r.wait_idle(1800)
        sync_s = time.perf_counter() - t0
        engine = r.engine
        engine.full_rescan_every = 4 if covered else 1  # the defaults' cycle (60 s / 15 s), or every rescan full
        records = len(engine.slots["bench"].records)
        cpu: list[float] = []
        wall: list[float] = []
        reobserved = 0
        for _ in range(reps):
            gc.collect()
            c0, w0 = time.process_time(), time.perf_counter()
            await engine.reconcile(None, Reason.RESCAN, periodic=covered)
            wall.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
            if peers is not None:
                peers.setdefault("find", []).append(_find_once(root))
                peers.setdefault("walk", []).append(_bare_walk_once(root))
                peers.setdefault("floor", []).append(_floor_walk_once(root))
            reobserved = max(reobserved, len(engine.agg))
            if len(engine.agg):
                # The pump sleeps until its next event; wake it so the re-observed paths settle.
                engine.emit(SourceEvent(EventKind.TOUCHED, None, "bench"))
            await r.wait_idle(600)
        if covered and engine.stats.covered_rescans < reps:
            raise RuntimeError(f"only {engine.stats.covered_rescans} of {reps} rescans were covered")
    return {"records": records, "initial_sync_s": sync_s, "reobserved": reobserved,
            "cpu": summary(cpu), "wall": summary(wall), "cpu_each": cpu}


def _bare_walk_once(root: Path) -> float:
    """CPU of the stat walk alone (``reloadd._pipeline._scan.scan``), the floor under any rescan: handed over in
    chunks, as a rescan's walk is (nothing compared; one that kept every entry of 100k in one table cost 20-45 ms
    more)."""
    c0 = time.process_time()
    scan(str(root), str(root), True, {}, {}, sink=lambda found, listed: None)
    return time.process_time() - c0


def _floor_walk_once(root: Path) -> float:
    """CPU of the least any stat walk costs in Python: each directory listed from its descriptor and each name
    ``lstat``-ed relative to it, nothing kept (no path, no fingerprint, no filter). What a full rescan's ratio to
    ``find`` cannot go below in CPython (here 100,000 ``lstat`` calls cost ~115 ms of system time and ~50 of user,
    the ``stat_result`` built per name included; ``find``: ~110 and ~80)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    c0 = time.process_time()
    stack = [str(root)]
    while stack:
        d = stack.pop()
        fd = os.open(d, flags)
        try:
            with os.scandir(fd) as entries:
                for e in entries:
                    st = os.lstat(e.name, dir_fd=fd)
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(d + "/" + e.name)
        finally:
            os.close(fd)
    return time.process_time() - c0


FIND_FORMAT = "%i %s %T@\\n"
"""What ``find`` prints per entry: inode, size, mtime (the fields a fingerprint compares)."""


def _find_once(root: Path) -> float:
    """CPU (user + system) of one ``find ROOT -printf '%i %s %T@\\n'``, the peer a rescan is held against, from the
    children's resource usage (microseconds; ``os.times`` counts clock ticks, 10 ms, a twentieth of a 100k walk)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(["find", str(root), "-printf", FIND_FORMAT], stdout=subprocess.DEVNULL, check=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime


def run(root: Path, state: Path, reps: int) -> dict[str, Any]:
    """Time ``reps`` rescans of the tree at ``root`` (already populated), and the peers on it."""
    files = sum(1 for _ in root.iterdir())
    peers: dict[str, list[float]] = {}
    full = asyncio.run(_measure(root, state, reps, peers=peers))
    covered = asyncio.run(_measure(root, state.with_name(state.name + "-covered"), reps, covered=True))
    rescans, finds = full["cpu_each"], peers["find"]
    return {"files": files, **full, "covered": covered, "walk_cpu": summary(peers["walk"]),
            "floor_cpu": summary(peers["floor"]), "find_cpu": summary(finds),
            "find_ratio": percentile([a / b for a, b in zip(rescans, finds, strict=True)], 50),
            "floor_find_ratio": percentile([a / b for a, b in zip(peers["floor"], finds, strict=True)], 50)}
