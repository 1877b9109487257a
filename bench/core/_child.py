"""One watcher in its own process, reporting every batch on stdout as a JSON line.

    python -m bench.core._child reloadd DIR --state STATE [--quiet S --max-delay S]
    python -m bench.core._child watchfiles DIR [--step MS --debounce MS]
    python -m bench.core._child floor DIR --state STATE
    python -m bench.core._child idlefloor DIR

Lines written: ``{"ev": "ready", "pid": N}`` once, then ``{"ev": "batch", "t": T, "names": [...]}``
per batch, where ``T`` is ``time.monotonic()`` (CLOCK_MONOTONIC, shared by every process
on the machine) taken first thing in the callback, and ``names`` are the file names (the
benchmarks use flat directories). A line ``stats`` on stdin makes the reloadd child print
``{"ev": "stats", ...}`` with its engine and queue counters.

The watchfiles child never imports reloadd, so its memory figures are its own; nor does the *floor* child
(:func:`run_floor`), the least Python code doing the work reloadd does for each changed file, nor the *idle
floor* (:func:`run_idle_floor`), the least doing what an idle reloadd does.
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


_IN_MASK = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800 | 0x01000000 | 0x04000000
"""MODIFY, ATTRIB, CLOSE_WRITE, MOVED_FROM, MOVED_TO, CREATE, DELETE, DELETE_SELF, MOVE_SELF, ONLYDIR, EXCL_UNLINK:
reloadd's inotify mask."""
_IN_Q_OVERFLOW, _IN_ISDIR = 0x4000, 0x40000000
FLOOR_STEP = 0.05
"""The floor's passes start at least this far apart (watchfiles' ``step``): one journal write and ``fsync`` a pass,
so a slow writer is not answered with one each few files."""


def _watch_tree(root: Path) -> tuple[int, dict[int, str], dict[str, tuple[int, int, int, int]]]:
    """What both floors start from, without reloadd: an inotify descriptor (ctypes) watching every directory
    under ``root`` with reloadd's mask, each watch's directory (``wd -> "dir/"``), and the fingerprint of every
    regular file."""
    import ctypes
    import stat

    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    dirs: dict[int, str] = {}
    records: dict[str, tuple[int, int, int, int]] = {}
    for d, _, files in os.walk(root):
        dirs[libc.inotify_add_watch(fd, os.fsencode(d), _IN_MASK)] = d + "/"
        for name in files:
            st = os.lstat(os.path.join(d, name))
            if stat.S_ISREG(st.st_mode):
                records[d + "/" + name] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return fd, dirs, records


def run_floor(root: Path, state: Path) -> None:
    """The least Python code doing, for each file a burst changes, the work reloadd guarantees (a yardstick).

    A thread reads the inotify descriptor as fast as events come (so the kernel queue does not overflow while a
    pass runs); each pass takes every event read so far, and for each path named: ``lstat``; a regular file
    whose inode, size and times differ from its record is opened, read and its SHA-256 taken (then ``fstat``-ed,
    as a probe checks the bytes read are the file's), and recorded; a recorded path gone is forgotten; a journal
    line each, appended and ``fsync``-ed once a pass; the names reported. None of reloadd's other work:
    no quiet period, no per-path queue or retry, no consumer call, no prune guard, no recovery (an overflow is
    only counted: stats report it).
    """
    import collections
    import hashlib
    import stat
    import struct

    fd, dirs, records = _watch_tree(root)
    state.mkdir(parents=True, exist_ok=True)
    journal = os.open(state / "journal", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    read: collections.deque[bytes] = collections.deque()
    woke = threading.Event()
    overflows = 0

    def reader() -> None:
        while True:
            read.append(os.read(fd, 65536))
            woke.set()

    def command() -> None:
        for line in sys.stdin:
            if line.strip() == "stats":
                emit({"ev": "stats", "overflows": overflows, "records": len(records)})

    threading.Thread(target=reader, name="floor-read", daemon=True).start()
    threading.Thread(target=command, name="bench-stdin", daemon=True).start()
    header = struct.Struct("iIII")
    emit({"ev": "ready", "pid": os.getpid()})
    last = 0.0
    while True:
        woke.wait()
        time.sleep(max(0.0, last + FLOOR_STEP - time.monotonic()))
        woke.clear()
        last = time.monotonic()
        chunks = []
        while read:
            chunks.append(read.popleft())
        buf = b"".join(chunks)
        paths: dict[str, None] = {}
        off = 0
        while off < len(buf):
            wd, mask, _, length = header.unpack_from(buf, off)
            name = buf[off + 16:off + 16 + length].rstrip(b"\0")
            off += 16 + length
            if mask & _IN_Q_OVERFLOW:
                overflows += 1
            elif name and not mask & _IN_ISDIR and wd in dirs:
                paths[dirs[wd] + os.fsdecode(name)] = None
        lines: list[str] = []
        names: list[str] = []
        for path in paths:
            try:
                st = os.lstat(path)
            except OSError:
                if records.pop(path, None) is not None:
                    lines.append(f'{{"p":{json.dumps(path)},"del":true}}')
                    names.append(path.rpartition("/")[2])
                continue
            fp = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if not stat.S_ISREG(st.st_mode) or records.get(path) == fp:
                continue
            try:
                f = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                digest = hashlib.sha256(os.read(f, st.st_size)).hexdigest()
                os.fstat(f)
            finally:
                os.close(f)
            records[path] = fp
            lines.append(f'{{"p":{json.dumps(path)},"r":{{"fp":[{fp[0]},{fp[1]},{fp[2]},{fp[3]}],"digest":"{digest}"}}}}')
            names.append(path.rpartition("/")[2])
        if lines:
            os.write(journal, ("\n".join(lines) + "\n").encode())
            os.fsync(journal)
            emit({"ev": "batch", "t": time.monotonic(), "names": names})


IDLE_INTERVAL = 15.0
"""Seconds between the idle floor's passes: reloadd's ``rescan_interval`` default."""
IDLE_SHARES = 4
"""Passes over which the idle floor stats every file once: reloadd's ``full_rescan_interval`` / ``rescan_interval``."""


async def run_idle_floor(root: Path, interval: float = IDLE_INTERVAL, shares: int = IDLE_SHARES) -> None:
    """The least Python code doing what an idle reloadd does over a tree (a yardstick for the idle figure).

    An asyncio loop (reloadd's runtime), an inotify watch on each directory and a thread blocked reading it
    (nothing changes: it never wakes), and every ``interval`` s, as reloadd's periodic rescan at its defaults:
    each directory opened and ``fstat``-ed; the one whose turn it is (its inode modulo ``shares``) listed and
    each name in it ``lstat``-ed and compared with the fingerprint recorded at start, so every file is stat-ed
    once in ``shares`` passes. None of reloadd's other work (no thread hand-off for the walk, no records
    beyond a dict of tuples, no state, no trim). Nothing of reloadd imported.
    """
    fd, watched, records = _watch_tree(root)
    dirs = [prefix[:-1] for prefix in watched.values()]
    threading.Thread(target=lambda: os.read(fd, 65536), name="floor-read", daemon=True).start()
    emit({"ev": "ready", "pid": os.getpid()})
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    tick = 0
    while True:
        await asyncio.sleep(interval)
        differing = 0
        for d in dirs:
            dfd = os.open(d, flags)
            try:
                if os.fstat(dfd).st_ino % shares != tick % shares:
                    continue
                prefix = d + "/"
                for name in os.listdir(dfd):
                    st = os.lstat(name, dir_fd=dfd)
                    if records.get(prefix + name) != (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
                        differing += 1
            finally:
                os.close(dfd)
        tick += 1
        if differing:
            emit({"ev": "batch", "t": time.monotonic(), "names": []})


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and run one watcher until killed."""
    ap = argparse.ArgumentParser(prog="python -m bench.core._child")
    ap.add_argument("kind", choices=["reloadd", "watchfiles", "floor", "idlefloor"])
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
    elif a.kind == "floor":
        run_floor(a.dir, a.state)
    elif a.kind == "idlefloor":
        asyncio.run(run_idle_floor(a.dir))
    else:
        asyncio.run(run_watchfiles(a.dir, a.step, a.debounce))


if __name__ == "__main__":
    main()
