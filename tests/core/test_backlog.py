"""A burst written faster than it settles is read as it settles.

While more paths are due than a settling step takes and many are settling, the inotify source keeps
what it read as bytes instead of handing it all over (``Engine.room``): the paths held at once stay
bounded (each is a few hundred bytes of objects until it settles, and a burst's peak of them stayed
behind as fragmented memory), every file is still handed over once, every consumer holds meanwhile,
and a loss of events among the held reads is parsed at once.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from reloadd._pipeline import _settle
from reloadd._pipeline._aggregator import Aggregator
from reloadd._pipeline._scan import Probe
from reloadd._source import EventKind, SourceContext, WatchRoot, file_event
from reloadd._sources import inotify as inotify_source

pytestmark = pytest.mark.timeout(120)

_WRITER = """
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    fd = os.open(f"{root}/f{i:05d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"x")
    os.close(fd)
"""


def _slow_settling(monkeypatch: pytest.MonkeyPatch, backlog: int, step: int, pause: float) -> None:
    """Settle ``step`` paths a step, each step ``pause`` seconds longer: a writer outruns it."""
    monkeypatch.setattr(_settle, "_BACKLOG", backlog)
    monkeypatch.setattr(_settle, "_STEP", step)
    monkeypatch.setattr(_settle, "_FEED_MAX", step)
    probe_all = _settle.probe_all

    def slow(jobs: Sequence[Any], reads: list[bool], limit: int) -> tuple[list[Probe], dict[Any, str | None]]:
        time.sleep(pause)
        return probe_all(jobs, reads, limit)  # type: ignore[arg-type]

    monkeypatch.setattr(_settle, "probe_all", slow)


async def test_a_burst_written_faster_than_it_settles_is_read_as_it_settles(
        tmp_path: Path, recorder_cls: Any, start_reloader: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """12,000 files from another process at full speed (~40,000 a second), settled ~1,600 a second: what the
    first quiet period read, then the bound and a few reads, settle at once (a few thousand), not nearly all
    12,000 (as when every read was handed over as it came); each file is handed over once."""
    root = tmp_path / "root"
    root.mkdir()
    _slow_settling(monkeypatch, backlog=256, step=64, pause=0.04)
    held: list[int] = []
    observe = Aggregator.observe

    def counting(self: Aggregator, *args: Any, **kw: Any) -> None:
        observe(self, *args, **kw)
        held.append(len(self))

    monkeypatch.setattr(Aggregator, "observe", counting)
    rec = recorder_cls([root])
    r = await start_reloader(rec, rescan_interval="0s", quiet="20ms")  # only inotify: nothing found by a walk
    n = 12_000
    writer = await asyncio.create_subprocess_exec(sys.executable, "-c", _WRITER, str(root), str(n))
    assert await writer.wait() == 0
    await rec.wait_for(lambda x: len(x.changes) >= n, timeout=90)
    await r.wait_idle(30)
    assert sorted(c.path.name for c in rec.changes) == [f"f{i:05d}" for i in range(n)]
    assert max(held) <= n // 2, max(held)
    assert r.engine.stats.reads_held > 0


async def test_every_consumer_holds_while_reads_are_held_back(
        tmp_path: Path, recorder_cls: Any, start_reloader: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a source holds back may be any consumer's: one with nothing settling holds too (its ``after``
    dependents wait), until there is room again."""
    a_root, b_root = tmp_path / "a", tmp_path / "b"
    a_root.mkdir()
    b_root.mkdir()
    _slow_settling(monkeypatch, backlog=32, step=16, pause=0.05)
    rec_a, rec_b = recorder_cls([a_root], name="a"), recorder_cls([b_root], name="b")
    r = await start_reloader(rec_a, rec_b, rescan_interval="0s")
    engine = r.engine
    assert not engine.holds("b")
    for i in range(400):
        (a_root / f"f{i:03d}").write_text("x")
    for _ in range(1000):  # until a step is cut short with more than the bound settling
        waiting = asyncio.ensure_future(engine.room(10.0))
        await asyncio.sleep(0)
        if not waiting.done():
            break
        await asyncio.sleep(0.01)
    else:
        pytest.fail("there was always room")
    assert engine.holds("b")
    assert engine.holds_any("b", lambda path: True)
    assert await waiting  # room again as paths settle
    await rec_a.wait_for(lambda x: len(x.changes) == 400, timeout=60)
    await r.wait_idle(30)
    assert not engine.holds("b")
    assert rec_b.changes == []


async def test_a_source_reading_ahead_of_the_pump_is_held_back_until_the_pump_takes_its_events(
        tmp_path: Path, recorder_cls: Any, start_reloader: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads parsed back to back hand their events in without a turn of the pump between them: once the bound
    is handed in and not taken, there is no room, even though the last settling step took all that was due (a
    100,000-file modify burst had ~74,000 events handed in at once that way: a peak of settling objects that
    stayed behind as +20 MiB of fragmented memory); room again as soon as the pump takes them."""
    monkeypatch.setattr(_settle, "_BACKLOG", 64)
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    r = await start_reloader(rec, rescan_interval="0s")
    engine = r.engine
    assert await engine.room(0.0)
    for read in range(4):  # four reads of 20 files, parsed in one turn of the loop
        engine.emit_all([file_event(EventKind.WRITTEN, str(root / f"r{read}-{i:02d}"), "inotify", 0)
                         for i in range(20)])
    assert not engine._backlog  # nothing was cut short: only the events handed in say "no room"
    assert not await engine.room(0.0)
    assert await engine.room(5.0)  # the pump takes them
    for read in range(3):
        engine.emit_all([file_event(EventKind.WRITTEN, str(root / f"s{read}-{i:02d}"), "inotify", 0)
                         for i in range(20)])
    assert await engine.room(0.0)  # under the bound
    await r.wait_idle(10)
    assert rec.changes == []  # none of those files exists: nothing to hand over


class _Reads:
    """A reader as the source sees it: the reads it holds say whether events were lost among them."""

    def __init__(self) -> None:
        self.marked = 0
        self.dropped = False


async def test_a_loss_of_events_among_held_reads_is_parsed_at_once(tmp_path: Path) -> None:
    """No room: reads wait; an overflow in the read at hand, one queued behind it, or reads dropped: no wait."""
    asked: list[float] = []

    async def never(timeout: float) -> bool:
        asked.append(timeout)
        await asyncio.sleep(timeout)
        return False

    source = inotify_source.InotifySource(SourceContext(roots=(WatchRoot(tmp_path),), emit=lambda ev: None,
                                                        room=never))
    reads = _Reads()
    plain = inotify_source._HEADER.pack(1, 0x2, 0, 0)  # a MODIFY of the watched directory itself
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(source._room(reads, plain), 0.3)  # type: ignore[arg-type]
    assert len(asked) >= 2  # it looked again, in case a loss came in meanwhile
    await asyncio.wait_for(source._room(reads, plain + inotify_source._OVERFLOW_EVENT), 0.3)  # type: ignore[arg-type]
    reads.marked = 1
    await asyncio.wait_for(source._room(reads, plain), 0.3)  # type: ignore[arg-type]
    reads.marked, reads.dropped = 0, True
    await asyncio.wait_for(source._room(reads, plain), 0.3)  # type: ignore[arg-type]
