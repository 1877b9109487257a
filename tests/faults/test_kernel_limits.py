"""Kernel limits: ``fs.inotify.max_user_watches`` and ``fs.inotify.max_queued_events`` lowered.

The daemon must degrade to rescans, say so once, and lose nothing. Both sysctls are global to
the machine, so each is lowered only for the few seconds the case needs and restored in a
``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asyncinotify import Inotify, Mask

from reloadd._sources import _inotify_reader as inotify_reader
from tests.reliability import Reliability

pytestmark = pytest.mark.timeout(120)


@contextlib.contextmanager
def sysctl(name: str, value: int) -> Iterator[None]:
    path = Path("/proc/sys") / name.replace(".", "/")
    old = path.read_text().strip()
    path.write_text(str(value))
    try:
        yield
    finally:
        path.write_text(old)


async def test_max_user_watches(tmp_path: Path, recorder_cls: Any, start_reloader: Any,
                                caplog: pytest.LogCaptureFixture, reliability: Reliability) -> None:
    root = tmp_path / "root"
    dirs = 40
    for i in range(dirs):
        (root / f"d{i:02d}").mkdir(parents=True)
    rec = recorder_cls([root])
    caplog.set_level(logging.INFO)
    t0 = time.monotonic()
    with sysctl("fs.inotify.max_user_watches", 12):
        r = await start_reloader(rec, rescan_interval="300ms")
        assert r.watch_state.startswith("degraded"), r.watch_state
        expected = set()
        for round_ in range(3):  # several rescans' worth of changes, each said nothing new
            for i in range(dirs):
                p = root / f"d{i:02d}" / f"r{round_}.conf"
                p.write_text(str(round_))
                expected.add(p)
            await rec.wait_for(lambda r: expected <= {c.path for c in r.changes}, timeout=30)
        status = r.status()
    delivered = {c.path for c in rec.changes} & expected
    said = caplog.text.count("fs.inotify.max_user_watches")
    reliability.record(
        "fs.inotify.max_user_watches=12, 41 directories", trials=1, expected=len(expected),
        delivered=len(delivered), duplicates=len(rec.changes) - len(set(rec.changes)), lost=len(expected - delivered),
        notes=f"watch state `{status['watch'][:40]}…`; limit logged {said}×; found by 300 ms rescans; "
              f"{time.monotonic() - t0:.1f}s",
    )
    assert delivered == expected
    assert said == 1


async def test_max_queued_events(tmp_path: Path, recorder_cls: Any, start_reloader: Any,
                                 caplog: pytest.LogCaptureFixture, reliability: Reliability,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # The reader thread empties the kernel queue as fast as it fills, so a 64-event queue overflows
    # only when the reader is slower than the burst: its pause between reads of a burst is made
    # 0.5 s (instead of 4 ms) so the kernel, not luck, decides that it does.
    monkeypatch.setattr(inotify_reader, "_GATHER", 0.5)
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    rec.gate = asyncio.Event()
    caplog.set_level(logging.INFO)
    files = 4000
    t0 = time.monotonic()
    with sysctl("fs.inotify.max_queued_events", 64):
        r = await start_reloader(rec, rescan_interval="0s")  # only the overflow rescan can find them
        (root / "first").write_text("x")
        await asyncio.wait_for(rec.entered.wait(), 10)  # the consumer is stalled: the queue fills

        def burst() -> None:
            for i in range(files):
                (root / f"f{i:05d}").write_text(str(i))

        burst()  # on the loop thread on purpose: nothing reads the 64-event queue until it overflows
        rec.gate.set()
        expected = {root / f"f{i:05d}" for i in range(files)}
        await rec.wait_for(lambda r: expected <= {c.path for c in r.changes}, timeout=60)
        await r.wait_idle(30)
        overflows = r.engine.stats.overflows
        delay = r.engine.stats.recovery_delay
        exported = r.snapshot().engine.recovery_delay
    said = caplog.text.count("inotify queue overflowed")
    delivered = {c.path for c in rec.changes} & expected
    seen: dict[Path, int] = {}
    for c in rec.changes:
        if c.path in expected:
            seen[c.path] = seen.get(c.path, 0) + 1
    reliability.record(
        f"fs.inotify.max_queued_events=64, {files} files in a burst", trials=1, expected=files,
        delivered=len(delivered), duplicates=sum(n - 1 for n in seen.values()), lost=files - len(delivered),
        notes=f"{overflows} overflow(s), warned {said}× (at most once a minute); recovered by rescan, started "
              f"{(delay or 0) * 1000:.0f} ms after the overflow was read; {time.monotonic() - t0:.1f}s",
    )
    assert delivered == expected
    assert overflows >= 1
    assert delay is not None and exported == delay  # measured, and exported (reloadd_overflow_rescan_delay_seconds)
    assert said == 1  # said once, however many overflows
    for p in expected:
        assert rec.changes_for(p)[-1].fingerprint is not None


async def test_the_reader_finds_an_overflow_as_the_kernel_writes_it(tmp_path: Path) -> None:
    """Reads that hold an overflow are counted as they are queued (the source then parses on without waiting
    for room, so the loss's rescan is not held back): the bytes searched for are the kernel's own."""
    root = tmp_path / "root"
    root.mkdir()
    with sysctl("fs.inotify.max_queued_events", 16):  # taken when the instance is made
        ino = Inotify()
    loop = asyncio.get_running_loop()
    woke = asyncio.Event()
    reader = inotify_reader.Reader(ino.fd, loop, woke.set)
    try:
        ino.add_watch(root, Mask.CREATE)
        for i in range(64):
            (root / f"f{i:02d}").write_text("x")
        os.set_blocking(ino.fd, False)
        reader.start()
        await asyncio.wait_for(woke.wait(), 10)
        assert reader.marked == 1
        data = b""
        while (chunk := reader.take()) is not None:
            data += chunk
        assert reader.marked == 0
        assert data.endswith(inotify_reader.OVERFLOW_EVENT)  # 16 creates, then the overflow
        assert len(data) == 16 * (inotify_reader.HEADER.size + 16) + len(inotify_reader.OVERFLOW_EVENT)
    finally:
        await asyncio.to_thread(reader.stop)
        ino.close()
