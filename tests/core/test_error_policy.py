"""The core owns the error policy: exceptions from handle() are mapped per path."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from reloadd import Ack, PermanentError, Retry, TransientError

pytestmark = pytest.mark.timeout(60)


def _records(r, path):
    return r.engine.slots["rec"].records.get(path)


async def test_permanent_error_rejects_and_keeps_previous_data(tmp_path, recorder_cls, start_reloader, caplog):
    root = tmp_path / "root"
    root.mkdir()
    target = root / "x.conf"
    target.write_text("good")

    class Strict(recorder_cls):
        async def handle(self, batch):
            out = await super().handle(batch)
            if any(c.path.read_text() == "corrupt" for c in batch.changes):
                raise PermanentError("bad magic in x.conf")
            return out

    rec = Strict([root])
    rec.results = lambda c: Ack({"version": 1})
    caplog.set_level(logging.DEBUG, "reloadd")
    r = await start_reloader(rec, rescan_interval="200ms")
    assert _records(r, target).data == {"version": 1}
    caplog.clear()
    target.write_text("corrupt")
    await rec.wait_path(target, 2)
    await r.wait_idle(10)
    for _ in range(3):  # several rescans pass: no retry of a permanent error
        await asyncio.sleep(0.3)
    assert len(rec.changes_for(target)) == 2
    record = _records(r, target)
    assert record.error == "bad magic in x.conf"
    assert record.data == {"version": 1}  # the previous data is kept
    assert r.status()["consumers"]["rec"]["failing"] == []
    assert r.status()["consumers"]["rec"]["rejected"] == [{"path": str(target), "error": "bad magic in x.conf"}]
    loud = [m for m in caplog.records if m.levelno >= logging.WARNING]
    assert len(loud) == 1
    assert loud[0].levelno == logging.WARNING and loud[0].exc_info is None
    assert str(target) in loud[0].getMessage() and "bad magic" in loud[0].getMessage()
    assert any(m.levelno == logging.DEBUG and m.exc_info for m in caplog.records)


async def test_transient_error_retries_with_one_warning_line(tmp_path, recorder_cls, start_reloader, caplog):
    root = tmp_path / "root"
    root.mkdir()
    failures = [2]

    class Flaky(recorder_cls):
        async def handle(self, batch):
            out = await super().handle(batch)
            if failures[0]:
                failures[0] -= 1
                raise TransientError("containerd is down")
            return out

    rec = Flaky([root])
    r = await start_reloader(rec)
    for s in r.engine.slots.values():
        s.queue._delay = lambda attempt: 0.1
    caplog.set_level(logging.DEBUG, "reloadd")
    target = root / "a.conf"
    target.write_text("a")
    await rec.wait_path(target, 3)
    await r.wait_idle(10)
    assert _records(r, target).error is None
    loud = [m for m in caplog.records if m.levelno >= logging.WARNING]
    assert len(loud) == 2  # one line per failed attempt
    assert all(m.levelno == logging.WARNING and m.exc_info is None for m in loud)
    assert all("containerd is down" in m.getMessage() for m in loud)


async def test_unexpected_exception_keeps_traceback_at_error(tmp_path, recorder_cls, start_reloader, caplog):
    root = tmp_path / "root"
    root.mkdir()

    class Buggy(recorder_cls):
        async def handle(self, batch):
            await super().handle(batch)
            raise KeyError("oops")

    rec = Buggy([root])
    await start_reloader(rec)
    target = root / "a.conf"
    target.write_text("a")
    await rec.wait_path(target)
    await asyncio.sleep(0)
    errors = [m for m in caplog.records if m.levelno == logging.ERROR]
    assert errors and errors[0].exc_info is not None and str(target) in errors[0].getMessage()


async def test_raising_path_does_not_fail_the_rest_of_its_batch(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    names = ["a.conf", "b.conf", "poison.conf", "c.conf"]
    for name in names:
        (root / name).write_text(name)  # the initial pass hands them over in one batch

    class Picky(recorder_cls):
        async def handle(self, batch):
            await super().handle(batch)
            names = {c.path.name for c in batch.changes}
            if "poison.conf" in names:
                raise (PermanentError("poison") if len(names) == 1 else TransientError("something in the batch"))
            return {c.path: Ack({"ok": c.path.name}) for c in batch.changes}

    rec = Picky([root])
    r = await start_reloader(rec)
    await rec.wait_for(lambda x: any(len(b.changes) > 1 and any(c.path.name == "poison.conf" for c in b.changes)
                                     for b in x.batches))
    await r.wait_idle(10)
    for name in ("a.conf", "b.conf", "c.conf"):
        record = _records(r, root / name)
        assert record is not None and record.error is None and record.data == {"ok": name}
    assert _records(r, root / "poison.conf").error == "poison"
    assert r.status()["consumers"]["rec"]["failing"] == []


async def test_retry_after_and_deliberate_waits(tmp_path, recorder_cls, start_reloader):
    """``Retry(after=…)`` sets the delay; ``failure=False`` is a wait: deferred, not failing, holds no one back."""
    root, other = tmp_path / "root", tmp_path / "other"
    root.mkdir()
    other.mkdir()
    answers = iter([Retry("held for a grace", after=0.6, failure=False), Retry("busy", after=0.3)])
    rec = recorder_cls([root], name="rec", results=lambda change: next(answers, None))
    later = recorder_cls([other], name="later", after=("rec",))
    r = await start_reloader(rec, later)
    (root / "a.conf").write_text("a")
    await rec.wait_path(root / "a.conf")
    first = time.monotonic()
    for _ in range(100):
        status = r.status()["consumers"]["rec"]
        if status["deferred"]:
            break
        await asyncio.sleep(0.01)
    assert status["failing"] == [] and [d["reason"] for d in status["deferred"]] == ["held for a grace"]
    assert status["deferred"][0]["retry_in"] <= 0.6  # the consumer's delay, not the 1-2 s first backoff
    (other / "b.conf").write_text("b")
    await later.wait_path(other / "b.conf", timeout=2)  # a deliberate wait holds back no one
    await rec.wait_path(root / "a.conf", count=2)
    second = time.monotonic()
    assert second - first >= 0.5  # not sooner than asked
    for _ in range(100):
        status = r.status()["consumers"]["rec"]
        if status["failing"]:
            break
        await asyncio.sleep(0.01)
    assert [f["error"] for f in status["failing"]] == ["busy"] and status["deferred"] == []
    assert status["failing"][0]["retry_in"] <= 0.3
    await rec.wait_path(root / "a.conf", count=3)
    assert time.monotonic() - second >= 0.25
    await r.wait_idle(10)


async def test_a_retry_in_progress_still_shows_as_failing(tmp_path, recorder_cls, start_reloader):
    """Between backoff and the next result the path is being retried: status keeps it failing (exit 3)."""
    root = tmp_path / "root"
    root.mkdir()
    answers = iter([Retry("down", after=0.3)])
    rec = recorder_cls([root], name="rec", results=lambda change: next(answers, None))
    r = await start_reloader(rec)
    (root / "a.conf").write_text("a")
    await rec.wait_path(root / "a.conf")
    rec.gate = asyncio.Event()
    rec.entered.clear()
    await asyncio.wait_for(rec.entered.wait(), 10)  # the retry is in flight, held
    status = r.status()["consumers"]["rec"]
    assert status["in_flight"] == [str(root / "a.conf")]
    assert [(f["path"], f["error"], f["retry_in"]) for f in status["failing"]] == [(str(root / "a.conf"), "down", 0.0)]
    assert r.engine.slots["rec"].queue.counts().failing == 1
    rec.gate.set()
    await r.wait_idle(10)
    assert r.status()["consumers"]["rec"]["failing"] == []
