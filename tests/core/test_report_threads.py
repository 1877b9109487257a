"""``Batch.report`` from a worker thread (#25): recorded once, the path freed, its next change delivered."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from pathlib import Path

import pytest

from reloadd import Ack, BaseConsumer, Batch, ConsumerContext, Result
from tests.waiting import until

pytestmark = pytest.mark.timeout(60)


class ThreadReporter(BaseConsumer):
    """Settles every path from a worker thread, as an embedder doing blocking work would."""

    def __init__(self, root: Path, late: bool = False) -> None:
        super().__init__(ConsumerContext(name="threads", paths=(root,), options={}, state_dir=Path("/nonexistent")))
        self.batches: list[Batch] = []
        self.threads: set[str] = set()
        self.late = late
        self.stray: list[threading.Thread] = []

    async def handle(self, batch: Batch) -> Mapping[Path, Result]:
        self.batches.append(batch)

        def work() -> None:
            self.threads.add(threading.current_thread().name)
            for c in batch.changes:
                batch.report(c.path, Ack({"text": c.path.read_text()}))

        if self.late:  # a thread that reports after handle() returned: too late to matter, never stranding
            t = threading.Thread(target=lambda: (asyncio.run(asyncio.sleep(0.2)), work()))
            t.start()
            self.stray.append(t)
            return {}
        await asyncio.to_thread(work)
        return {}


async def test_report_from_to_thread_acknowledges_once_and_the_next_change_is_delivered(tmp_path, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    f = root / "a.conf"
    f.write_text("one")
    c = ThreadReporter(root)
    r = await start_reloader(c)
    assert c.threads and threading.main_thread().name not in c.threads
    assert r.engine.slots["threads"].records[f].data == {"text": "one"}
    status = r.status()["consumers"]["threads"]
    assert status["in_flight"] == [] and status["pending"] == []

    f.write_text("two")
    await until(lambda: len(c.batches) == 2, what="the next change delivered")
    await r.wait_idle(10)
    assert r.engine.slots["threads"].records[f].data == {"text": "two"}
    assert r.engine.slots["threads"].queue.stats.acked == 2  # once per change, not twice


async def test_a_report_after_handle_returned_strands_nothing(tmp_path, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    f = root / "a.conf"
    f.write_text("one")
    c = ThreadReporter(root, late=True)
    r = await start_reloader(c)
    await asyncio.to_thread(c.stray[0].join, 10)
    f.write_text("two")
    await until(lambda: len(c.batches) == 2, what="the next change delivered")
    await asyncio.to_thread(c.stray[1].join, 10)
    await r.wait_idle(10)
    assert r.status()["consumers"]["threads"]["in_flight"] == []
