"""Guarded state in the core: the ``drift`` mode, the fight backoff and what status and metrics say.

A third-party-style consumer contributes a far-side source (``SourceProvider``) that reports drift of its
files; the real engine decides what is handed over again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

import reloadd
from reloadd import Ack, BaseConsumer, Batch, Drift, DriftMode, EventKind, Result, SourceContext, SourceEvent
from reloadd._ops._terminal import format_status
from reloadd._pipeline._drift import FIGHT_WINDOW, DriftBook

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_fight_backs_off_and_separate_drifts_are_corrected_at_once() -> None:
    clock = Clock()
    book = DriftBook("c", DriftMode.CORRECT, clock=clock)
    d = Drift("object", "ConfigMap ns/x", "data.v changed", "fighter (Update)")
    assert book.saw("/f", d) == 0.0  # the first drift: at once
    book.correcting("/f")
    book.settled("/f")
    delays = []
    for _ in range(8):  # something undoes each correction right after it
        clock.now += 0.1
        delay = book.saw("/f", d)
        assert delay is not None
        assert book.saw("/f", d) is None  # a correction already waits: more events change nothing
        delays.append(delay)
        clock.now += delay
        book.correcting("/f")
        book.settled("/f")
    assert delays == [1, 2, 4, 8, 16, 32, 64, 128]
    (entry,) = book.entries()
    assert entry.fighting and entry.corrections == 9 and entry.drift.by == "fighter (Update)"

    clock.now += 2 * 256 + 1  # it stayed put (twice the next delay): the next drift is a new episode, corrected at once
    assert book.saw("/f", d) == 0.0
    other = DriftBook("c", DriftMode.CORRECT, clock=clock)
    assert other.saw("/g", d) == 0.0
    other.correcting("/g")
    other.settled("/g")
    clock.now += FIGHT_WINDOW + 0.1  # a person's second edit, later: no backoff
    assert other.saw("/g", d) == 0.0
    assert dict(other.total) == {"object": 2}


def test_detect_lists_until_the_file_is_handed_over_and_off_ignores() -> None:
    book = DriftBook("c", DriftMode.DETECT)
    assert book.saw("/f", Drift("image", "img:1", "deleted")) is None
    assert [e.drift.what for e in book.drifted()] == ["img:1"]
    book.settled("/f")  # the file applied again (an edit, a SIGHUP)
    assert book.entries() == []
    off = DriftBook("c", DriftMode.OFF)
    assert off.saw("/f", Drift("image", "img:1", "deleted")) is None and off.entries() == [] and not off.total


class Guarded(BaseConsumer):
    """A consumer whose far-side source reports drift of ``target`` every ``every`` seconds, ``times`` times."""

    def __init__(self, ctx: reloadd.ConsumerContext, target: Path, every: float, times: int) -> None:
        super().__init__(ctx)
        self.target, self.every, self.times = target, every, times
        self.batches: list[Batch] = []

    async def handle(self, batch: Batch) -> Mapping[Path, Result]:
        self.batches.append(batch)
        return {c.path: Ack() for c in batch.changes}

    def sources(self) -> Sequence[Callable[[SourceContext], reloadd.Source]]:
        consumer = self

        class Far:
            name = "far"

            def __init__(self, ctx: SourceContext) -> None:
                self.ctx = ctx

            async def run(self) -> None:
                for _ in range(consumer.times):
                    self.ctx.emit(SourceEvent(EventKind.DRIFTED, consumer.target, source="far", consumer=consumer.name,
                                              drift=Drift("thing", "t1", "moved", "someone")))
                    await asyncio.sleep(consumer.every)  # the far side's own pace
                await asyncio.Event().wait()

        return (Far,)


@pytest.mark.parametrize("mode", ["correct", "detect", "off"])
async def test_the_engine_corrects_backs_off_or_only_reports(tmp_path: Path, mode: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    target = root / "a.conf"
    target.write_text("x")
    ctx = reloadd.ConsumerContext(name="g", paths=(root,), options={}, state_dir=tmp_path / "priv",
                                  drift=DriftMode(mode))
    c = Guarded(ctx, target, every=0.05, times=80)  # 4 s of drift every 50 ms
    r2 = reloadd.Reloader(reloadd.parse_config({"reloadd": {"state_dir": str(tmp_path / "state"), "quiet": "20ms"}}))
    r2.add_consumer(c)
    start = time.monotonic()
    async with r2:
        await r2.wait_idle(10)
        await asyncio.sleep(4.5)  # the source's 4 s of drift, and a little more: there is nothing to await
        forced = [b for b in c.batches if b.reason is reloadd.Reason.DRIFT]
        status = r2.status()["consumers"]["g"]
        snap = r2.snapshot().consumers[0]
    assert time.monotonic() - start < 30
    if mode == "off":
        assert forced == [] and status["drift"] == [] and snap.drift_total == {}
        return
    assert snap.drift_total == {"thing": 80}
    (entry,) = status["drift"]
    assert (entry["what"], entry["by"], entry["path"]) == ("t1", "someone", str(target))
    if mode == "detect":
        assert forced == [] and not entry["restored"] and snap.drifted == 1
        assert "detect only" in format_status(r2.status())
        return
    # 0, 1, 3 s: three corrections in 4 s of drift every 50 ms (one per event would be 80).
    assert 2 <= len(forced) <= 4, [b.reason for b in c.batches]
    assert entry["fighting"] and "FIGHTING someone" in format_status(r2.status())
