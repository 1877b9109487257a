"""Per-path work queues: failures retried with backoff, never holding back others."""

from __future__ import annotations

import asyncio

import pytest

from reloadd import Ack, ChangeKind, Reject, Reloader, Retry
from reloadd._pipeline import _settle
from reloadd._pipeline._aggregator import Aggregator

from ..conftest import config_for

pytestmark = pytest.mark.timeout(60)


async def test_failed_path_retried_without_holding_back_others(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    failures = {"bad.conf": 2}

    def results(change):
        left = failures.get(change.path.name, 0)
        if left:
            failures[change.path.name] = left - 1
            return Retry("service unavailable")
        return None

    rec.results = results
    r = await start_reloader(rec)
    for q in r.engine.slots.values():
        q.queue._delay = lambda attempt: 0.2 * attempt  # fast backoff for the test
    (root / "bad.conf").write_text("b")
    (root / "good.conf").write_text("g")
    await rec.wait_path(root / "good.conf")
    assert len(rec.changes_for(root / "bad.conf")) == 1  # good was delivered before bad succeeded
    await rec.wait_path(root / "bad.conf", 3)
    await r.wait_idle(10)
    assert len(rec.changes_for(root / "bad.conf")) == 3
    assert r.status()["consumers"]["rec"]["failing"] == []


async def test_a_failing_path_counts_as_waiting_while_its_retry_is_in_flight(tmp_path, recorder_cls,
                                                                            start_reloader):
    # Readiness (ready_max_age) is the age of the oldest waiting path: a path stuck failing must not
    # leave it for the duration of each retry, or /readyz flaps to 200 with every attempt.
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    rec.results = lambda change: Retry("service unavailable")
    r = await start_reloader(rec)
    queue = r.engine.slots["rec"].queue
    queue._delay = lambda attempt: 0.5  # retries come quickly for the test
    (root / "bad.conf").write_text("b")
    await rec.wait_path(root / "bad.conf")
    rec.gate = asyncio.Event()  # the next attempt stays in flight
    rec.entered.clear()
    await asyncio.wait_for(rec.entered.wait(), 10)
    assert queue._inflight and not queue._items
    assert queue.oldest_age() > 0.4  # waiting since its first attempt, though in flight now
    rec.gate.set()


async def test_rejected_path_not_retried_until_it_changes(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    rec.results = lambda c: Reject("corrupt: bad magic") if "broken" in c.path.read_text() else Ack({"ok": 1})
    r = await start_reloader(rec, rescan_interval="200ms")
    target = root / "x.conf"
    target.write_text("broken")
    await rec.wait_path(target)
    for _ in range(3):  # several rescans pass
        await asyncio.sleep(0.3)
    assert len(rec.changes_for(target)) == 1
    status = r.status()["consumers"]["rec"]
    assert status["rejected"] == [{"path": str(target), "error": "corrupt: bad magic"}]
    target.write_text("fixed")
    await rec.wait_path(target, 2)
    await r.wait_idle(10)
    assert r.status()["consumers"]["rec"]["rejected"] == []


async def test_raising_consumer_does_not_affect_another(tmp_path, recorder_cls, start_reloader, caplog):
    root = tmp_path / "root"
    root.mkdir()

    class Exploding(recorder_cls):
        async def handle(self, batch):
            await super().handle(batch)
            raise RuntimeError("boom")

    bad = Exploding([root], name="bad")
    good = recorder_cls([root], name="good")
    await start_reloader(bad, good)
    (root / "a.conf").write_text("a")
    await good.wait_path(root / "a.conf")
    await bad.wait_path(root / "a.conf")
    assert f"Failed to handle {root / 'a.conf'} in consumer bad: boom" in caplog.text


async def test_change_while_in_flight_is_delivered_once_more(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    r = await start_reloader(rec)
    rec.gate = asyncio.Event()
    rec.entered.clear()
    target = root / "x.conf"
    target.write_text("v1")
    await asyncio.wait_for(rec.entered.wait(), 10)
    for i in range(2, 6):  # several saves while v1 is in flight
        target.write_text(f"v{i}")
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    rec.gate.set()
    await rec.wait_path(target, 2)
    await r.wait_idle(10)
    kinds = [c.kind for c in rec.changes_for(target)]
    assert kinds == [ChangeKind.ADDED, ChangeKind.MODIFIED]


async def test_concurrency_limit(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    active = 0
    peak = 0

    class Slow(recorder_cls):
        concurrency = 2
        async def handle(self, batch):
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.2)
            active -= 1
            return await super().handle(batch)

    rec = Slow([root])
    r = await start_reloader(rec)
    for q in r.engine.slots.values():
        q.queue.max_batch = 1
    for i in range(6):
        (root / f"f{i}").write_text(str(i))
    await rec.wait_for(lambda x: len(x.changes) == 6)
    assert peak == 2


async def test_path_reported_early_is_free_while_its_batch_goes_on(tmp_path, start_reloader):
    """``batch.report()`` settles a path at once: its next change goes while a slow path holds the batch."""
    from reloadd import BaseConsumer, ConsumerContext

    root = tmp_path / "root"
    root.mkdir()
    release = asyncio.Event()
    seen: list[tuple[str, str]] = []

    class Reporting(BaseConsumer):
        concurrency = 2

        async def handle(self, batch):
            slow = []
            for c in batch.changes:
                seen.append((c.path.name, c.path.read_text()))
                if c.path.name == "slow.conf":
                    slow.append(c.path)
                else:
                    batch.report(c.path, Ack({"v": c.path.read_text()}))
            if slow:
                await release.wait()
            return {p: Ack() for p in slow}

    consumer = Reporting(ConsumerContext(name="rep", paths=(root,), options={}, state_dir=tmp_path / "unused"))
    r = await start_reloader(consumer)
    (root / "slow.conf").write_text("s")
    (root / "fast.conf").write_text("1")
    for _ in range(200):
        if ("fast.conf", "1") in seen and ("slow.conf", "s") in seen:
            break
        await asyncio.sleep(0.02)
    assert ("fast.conf", "1") in seen and ("slow.conf", "s") in seen
    (root / "fast.conf").write_text("2")  # while slow.conf still holds the batch both came in
    for _ in range(200):
        if ("fast.conf", "2") in seen:
            break
        await asyncio.sleep(0.02)
    assert ("fast.conf", "2") in seen, f"fast.conf's edit waited for the slow path: {seen}"
    for _ in range(200):  # its acknowledgement is being written
        if r.status()["consumers"]["rep"]["in_flight"] == [str(root / "slow.conf")]:
            break
        await asyncio.sleep(0.02)
    assert r.status()["consumers"]["rep"]["in_flight"] == [str(root / "slow.conf")]
    assert r.engine.slots["rep"].records.get(root / "fast.conf").data == {"v": "2"}
    release.set()
    await r.wait_idle(10)
    assert [s for s in seen if s[0] == "fast.conf"] == [("fast.conf", "1"), ("fast.conf", "2")]


async def test_retry_after_is_capped_by_the_backoff_maximum(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    answers = iter([Retry("overloaded", after=3600.0)])
    rec.results = lambda c: next(answers, None)
    r = await start_reloader(rec)
    for q in r.engine.slots.values():
        q.queue._backoff_max = 0.3
    (root / "a.conf").write_text("a")
    await rec.wait_path(root / "a.conf", 2, timeout=5)  # not an hour later
    await r.wait_idle(10)
    assert r.status()["consumers"]["rec"]["failing"] == []


async def test_a_fast_consumer_with_a_backlog_gets_larger_batches(tmp_path, recorder_cls, start_reloader):
    """A backlog goes to a consumer that acknowledges fast in batches that grow past 512, to 2,048 at most:
    what a batch holds while in flight is bounded however long the backlog."""
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    rec.gate = asyncio.Event()  # the first batch waits until the whole backlog is queued behind it
    r = await start_reloader(rec)
    queue = r.engine.slots["rec"].queue
    for i in range(12_000):
        (root / f"f{i:05d}").write_text(str(i))
    await asyncio.wait_for(rec.entered.wait(), 30)
    for _ in range(600):
        if len(queue._items) + len(queue._inflight) >= 12_000:
            break
        await asyncio.sleep(0.05)
    rec.gate.set()
    await rec.wait_for(lambda x: len(x.changes) == 12_000, timeout=60)
    sizes = [len(b.changes) for b in rec.batches]
    assert sizes[0] <= 512 and max(sizes) > 512, sizes
    assert max(sizes) <= 2048 and sum(sizes) == 12_000, sizes


async def test_a_big_start_up_pass_takes_its_findings_in_a_settling_step_at_a_time(
        tmp_path, recorder_cls, start_reloader, monkeypatch):
    """The start-up pass's 6,000 findings are not 6,000 aggregator entries at once (a 100k pass: ~20 MiB of
    peak memory, left fragmented), but a settling step's worth (1,024 here) at a time; each is handed over once."""
    root = tmp_path / "root"
    root.mkdir()
    names = [f"f{i:05d}" for i in range(6000)]
    for name in names:
        (root / name).write_text(name)
    monkeypatch.setattr(_settle, "_FEED_MAX", 1024)
    held: list[int] = []
    observe = Aggregator.observe

    def counting(self: Aggregator, *args: object, **kw: object) -> None:
        observe(self, *args, **kw)  # type: ignore[arg-type]
        held.append(len(self))

    monkeypatch.setattr(Aggregator, "observe", counting)
    rec = recorder_cls([root])
    await start_reloader(rec)
    await rec.wait_for(lambda x: len(x.changes) == 6000, timeout=60)
    assert sorted(c.path.name for c in rec.changes) == names
    assert len(held) == 6000 and max(held) <= 3 * 1024, max(held)


async def test_a_retry_in_flight_does_not_make_the_node_unready(tmp_path, recorder_cls):
    """Every path found at start-up was handed over once: one whose retry is running right now keeps it ready."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.conf").write_text("a")
    retrying, release = asyncio.Event(), asyncio.Event()

    class Flaky(recorder_cls):  # type: ignore[misc, valid-type]
        async def handle(self, batch):  # type: ignore[no-untyped-def]
            if self.batches:  # the retry: held in flight
                retrying.set()
                await release.wait()
            return await super().handle(batch)

    rec = Flaky([root])
    rec.results = lambda change: Retry("busy", after=0.05) if len(rec.batches) == 1 else None
    async with Reloader(config_for(tmp_path), consumers=[rec]) as r:
        await asyncio.wait_for(retrying.wait(), 10)
        assert r.status()["ready"] is True, r.status()["ready_problems"]
        release.set()
        await r.wait_idle(10)
    assert len(rec.batches) == 2


async def test_a_path_acknowledged_without_a_result_keeps_its_data_and_takes_the_new_fingerprint(
        tmp_path, recorder_cls, start_reloader):
    """A consumer that returns nothing for a path acknowledges it as handed over: the data it stored with an
    earlier ``Ack`` stays (read back after a restart, so from the journal), the fingerprint and digest are the
    new file's, and an error recorded before is cleared."""
    root = tmp_path / "root"
    root.mkdir()
    target = root / "x.conf"
    target.write_text("one")
    rec = recorder_cls([root])
    rec.results = lambda c: Ack({"images": ["a", "b"], "n": 1.5})
    r = await start_reloader(rec)
    rec.results = lambda c: Reject("broken") if c.path.read_text() == "two" else None
    target.write_text("two")
    await rec.wait_path(target, 2)
    await r.wait_idle(10)
    target.write_text("three!")
    await rec.wait_path(target, 3)
    await r.wait_idle(10)
    await r.close()
    again = recorder_cls([root])
    async with Reloader(config_for(tmp_path), consumers=[again]) as r2:
        await r2.wait_idle(10)
        record = r2.engine.slots["rec"].records[target]
    assert again.changes == []  # acknowledged as it is now
    assert record.data == {"images": ["a", "b"], "n": 1.5} and record.error is None
    assert record.fingerprint is not None and record.fingerprint.size == 6
