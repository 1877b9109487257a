"""One watcher in its own process, reporting every batch on stdout as a JSON line.

    python -m bench.core._child reloadd DIR --state STATE [--quiet S --max-delay S]
    python -m bench.core._child watchfiles DIR [--step MS --debounce MS]

Lines written: ``{"ev": "ready", "pid": N}`` once, then ``{"ev": "batch", "t": T, "names": [...]}``
per batch, where ``T`` is ``time.monotonic()`` (CLOCK_MONOTONIC, shared by every process
on the machine) taken first thing in the callback, and ``names`` are the file names (the
benchmarks use flat directories). A line ``stats`` on stdin makes the reloadd child print
``{"ev": "stats", ...}`` with its engine and queue counters.

The watchfiles child never imports reloadd, so its memory figures are its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def emit(obj: dict[str, Any]) -> None:
    """Write one JSON line to stdout and flush it (the parent reads line by line)."""
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _stdin_commands(loop: asyncio.AbstractEventLoop, handler: Callable[[str], None]) -> None:
    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(handler, line.strip())

    threading.Thread(target=read, name="bench-stdin", daemon=True).start()


async def run_reloadd(root: Path, state: Path, quiet: float | None, max_delay: float | None) -> None:
    """Watch ``root`` with a Reloader whose consumer stamps and reports every batch."""
    from reloadd import BaseConsumer, Batch, ConsumerContext, Reloader, Result, parse_config, tune_gc, tune_malloc

    tune_malloc()  # this process is reloadd's own, as `reloadd run`'s is
    tune_gc()

    class Stamp(BaseConsumer):
        """Acknowledge everything; report the batch's arrival time and names."""

        async def handle(self, batch: Batch) -> Mapping[Path, Result]:
            t = time.monotonic()
            emit({"ev": "batch", "t": t, "reason": str(batch.reason), "names": [c.path.name for c in batch.changes]})
            return {}

    settings: dict[str, Any] = {"state_dir": str(state)}
    if quiet is not None:
        settings["quiet"] = quiet
    if max_delay is not None:
        settings["max_delay"] = max_delay
    ctx = ConsumerContext(name="bench", paths=(root,), options={}, state_dir=state / "consumer")
    reloader = Reloader(parse_config({"reloadd": settings}), consumers=[Stamp(ctx)])

    def command(cmd: str) -> None:
        if cmd == "stats":
            eng = reloader.engine
            q = eng.slots["bench"].queue.stats
            emit({"ev": "stats", "overflows": eng.stats.overflows, "rescans": eng.stats.rescans,
                  "rescan_seconds": eng.stats.rescan_seconds, "handed_over": eng.stats.handed_over,
                  "recovery_delay": eng.stats.recovery_delay, "restarted_rescans": eng.stats.restarted_rescans,
                  "recovery_delays": list(eng.stats.recovery_delays),
                  "batches": q.batches, "acked": q.acked, "records": len(eng.slots["bench"].records),
                  "watch": reloader.watch_state})

    async with reloader:
        await reloader.wait_idle(600)
        _stdin_commands(asyncio.get_running_loop(), command)
        emit({"ev": "ready", "pid": os.getpid()})
        await asyncio.Event().wait()


async def run_watchfiles(root: Path, step: int | None, debounce: int | None) -> None:
    """Watch ``root`` with watchfiles' ``awatch`` and report every yielded set."""
    from watchfiles import awatch

    kw: dict[str, Any] = {}
    if step is not None:
        kw["step"] = step
    if debounce is not None:
        kw["debounce"] = debounce
    emit({"ev": "ready", "pid": os.getpid()})
    async for changes in awatch(root, **kw):
        t = time.monotonic()
        emit({"ev": "batch", "t": t, "names": [os.path.basename(p) for _, p in changes]})


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and run one watcher until killed."""
    ap = argparse.ArgumentParser(prog="python -m bench.core._child")
    ap.add_argument("kind", choices=["reloadd", "watchfiles"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--state", type=Path)
    ap.add_argument("--quiet", type=float)
    ap.add_argument("--max-delay", type=float)
    ap.add_argument("--step", type=int)
    ap.add_argument("--debounce", type=int)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    if a.kind == "reloadd":
        asyncio.run(run_reloadd(a.dir, a.state, a.quiet, a.max_delay))
    else:
        asyncio.run(run_watchfiles(a.dir, a.step, a.debounce))


if __name__ == "__main__":
    main()
