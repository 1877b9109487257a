"""A periodic rescan that falls due while paths settle waits for them, at most one interval.

The watch is delivering those paths; a walk in the middle of a burst meets a tree in flux and judges
gone every removed file whose event is not read yet (a delete burst of 100,000 files peaked at 141 MiB
with one). The walk runs once they are handed over, or after ``rescan_interval`` at the latest.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from reloadd._ops._metrics import ReloaderCollector, render
from reloadd._source import EventKind, SourceEvent
from tests.waiting import until

pytestmark = pytest.mark.timeout(60)


async def test_a_periodic_rescan_waits_for_the_paths_settling_then_runs(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    r = await start_reloader(rec, rescan_interval="30s", quiet="1s", max_delay="5s")
    engine = r.engine
    at_handle: list[int] = []
    rec.results = lambda change: at_handle.append(engine.stats.rescans)  # type: ignore[func-returns-value]
    target = root / "a.conf"
    target.write_text("a")
    await until(lambda: len(engine.agg) > 0, what="the write's event", every=0.005)  # it settles for a second
    before = engine.stats.rescans
    engine.emit(SourceEvent(EventKind.RESCAN, None, "rescan"))  # the timer's tick (the source's own event)
    await asyncio.sleep(0.3)
    assert engine.stats.rescans == before and len(engine.agg) == 1
    await rec.wait_path(target)
    assert at_handle == [before]  # no walk while it settled
    assert engine.stats.rescans_waited == 1
    await until(lambda: engine.stats.rescans > before, what="the rescan that waited", timeout=5, every=0.01)
    assert engine.stats.rescans == before + 1  # it ran once, once the path was handed over
    await r.wait_idle(5)
    # What an operator reads: the ops snapshot and /metrics.
    snap = r.snapshot()
    assert snap.engine is not None and snap.engine.rescans_waited == 1
    text = render(ReloaderCollector(r).collect()).decode()
    assert "\nreloadd_rescans_waited_total 1.0\n" in text


async def test_a_periodic_rescan_waits_one_interval_at_most(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    r = await start_reloader(rec, rescan_interval="300ms", quiet="500ms", max_delay="30s")
    engine = r.engine
    target = root / "busy.conf"
    target.write_text("0")
    await until(lambda: len(engine.agg) > 0, what="the write's event", every=0.005)
    before = engine.stats.rescans
    end = time.monotonic() + 3.0
    i = 0
    while time.monotonic() < end:  # written every 100 ms: never quiet for 500 ms, always settling
        i += 1
        target.write_text(str(i))
        await asyncio.sleep(0.1)
        assert len(engine.agg) > 0
    assert rec.changes_for(target) == []
    # A tick every 300 ms, each waiting 300 ms at most: at least one walk every ~600 ms.
    assert engine.stats.rescans - before >= 3
