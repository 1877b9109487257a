"""A burst is not held up by rewriting every record: the journal is compacted once the burst is over."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from reloadd import Reloader
from reloadd._state._records import FlushJob, RecordStore
from reloadd._types import Fingerprint, PathRecord

from ..conftest import config_for

pytestmark = pytest.mark.timeout(120)

FP = Fingerprint(1, 2, 3, 4)


async def test_a_burst_of_changes_compacts_the_records_after_it_not_in_its_middle(tmp_path, recorder_cls,
                                                                                 monkeypatch):
    """200 recorded files rewritten at once, handed over 16 at a time: the journal outgrows the records with
    the first batch, yet no snapshot of every record is decided while paths of the burst are still queued or
    settling; one is, once every path was handed over, and a restart reads every path as last acknowledged."""
    root = tmp_path / "root"
    root.mkdir()
    for i in range(200):
        (root / f"f{i:03d}").write_text("a")
    rec = recorder_cls([root])
    rewritten = lambda x: sum(1 for c in x.changes if c.fingerprint and c.fingerprint.size == 2)  # noqa: E731
    compactions: list[int] = []  # paths of the burst handed over when each snapshot was decided
    real = RecordStore.prepare

    async with Reloader(config_for(tmp_path, quiet="50ms"), consumers=[rec]) as r:
        await r.wait_idle(30)
        slot = r.engine.slots["rec"]
        slot.queue.max_batch = 16
        slot.records._compact_after = 50  # the records' own size is then the limit: 200 lines
        assert len(slot.records) == 200 and not slot.records.compaction_due

        def prepare(self: RecordStore, *, busy: bool = False) -> FlushJob | None:
            job = real(self, busy=busy)
            if job is not None and job.snapshot is not None:
                compactions.append(rewritten(rec))  # on the loop, where the queue decides
            return job

        monkeypatch.setattr(RecordStore, "prepare", prepare)
        for i in range(200):
            (root / f"f{i:03d}").write_text("bb")
        await rec.wait_for(lambda x: rewritten(x) == 200, timeout=60)
        await r.wait_idle(30)
        for _ in range(100):  # the burst's last flush compacts, or the queue's tidying once all is idle
            if compactions and not slot.records.compaction_due:
                break
            await asyncio.sleep(0.05)
        assert compactions == [200]  # one snapshot, once every path of the burst was handed over
        assert not slot.records.compaction_due

    again = RecordStore(tmp_path / "state" / "consumers" / "rec")
    again.load(read_only=True)
    assert len(again) == 200
    assert all(again[root / f"f{i:03d}"].fingerprint.size == 2 for i in range(200))  # type: ignore[union-attr]


def test_a_busy_flush_puts_a_due_compaction_off_until_the_journal_doubles(tmp_path):
    s = RecordStore(tmp_path / "st", compact_after=10)
    s.load()
    for i in range(10):
        s.put(Path(f"/f{i}"), PathRecord(FP))
    s.flush()  # 10 lines: not over
    snapshots = lambda: os.path.exists(tmp_path / "st" / "records.json")  # noqa: E731

    for i in range(10):
        s.put(Path(f"/f{i}"), PathRecord(FP, "d1"))
    job = s.prepare(busy=True)  # 20 lines for 10 records: due, put off
    assert job is not None and job.snapshot is None
    s.write(job)
    assert s.compaction_due and not snapshots()
    assert s.prepare(busy=True) is None  # nothing buffered, busy: nothing to do

    job = s.prepare()  # the burst is over: due, compacted with nothing buffered
    assert job is not None and job.snapshot is not None and job.lines == []
    s.write(job)
    assert snapshots() and not s.compaction_due

    for rnd in range(2, 5):  # busy all along: compacted once the journal holds twice the records
        for i in range(10):
            s.put(Path(f"/f{i}"), PathRecord(FP, f"d{rnd}"))
        job = s.prepare(busy=True)
        assert job is not None
        assert (job.snapshot is not None) == (rnd == 4), rnd
        s.write(job)
    t = RecordStore(tmp_path / "st")
    t.load()
    assert {p: rec.digest for p, rec in t.items()} == {Path(f"/f{i}"): "d4" for i in range(10)}


def test_a_compaction_writes_the_records_as_prepared_and_holds_little_meanwhile(tmp_path):
    """The snapshot a flush writes in a worker thread is the records as they were when it was prepared, whatever
    the loop changes meanwhile; and what it holds until then is every path and record once (two tuples, 16
    bytes a record), not a copy of the table (38 for 100,000): it is taken at the end of a burst, when memory peaks."""
    import tracemalloc

    s = RecordStore(tmp_path / "st", compact_after=10)
    s.load()
    for rnd in range(2):  # the journal outgrows the records: a compaction is due
        for i in range(100_000):
            s.put(Path(f"/srv/f{i:06d}"), PathRecord(FP, f"{i + rnd:064x}"))
        if rnd == 0:
            s.flush()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        job = s.prepare()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert job is not None and job.snapshot is not None
    assert held / 100_000 < 20, held / 100_000
    s.put(Path("/srv/new"), PathRecord(FP))  # the loop goes on while the job waits for its thread
    s.drop(Path("/srv/f000000"))
    s.put(Path("/srv/f000001"), PathRecord(FP, "ff" * 32))
    s.write(job)

    written = RecordStore(tmp_path / "st")
    written.load(read_only=True)
    assert len(written) == 100_000 and Path("/srv/new") not in written
    assert written[Path("/srv/f000000")].digest == f"{1:064x}" and written[Path("/srv/f000001")].digest == f"{2:064x}"
    s.flush()  # then the changes made meanwhile are journaled over it
    after = RecordStore(tmp_path / "st")
    after.load(read_only=True)
    assert Path("/srv/new") in after and Path("/srv/f000000") not in after
    assert after[Path("/srv/f000001")].digest == "ff" * 32 and len(after) == 100_000
