"""Regressions found in review: each reproduces a way a change could be lost, held or repeated."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from reloadd import ChangeKind, PathRecord, Retry
from reloadd._state._records import RecordStore
from reloadd._types import Fingerprint

from ..conftest import config_for

pytestmark = pytest.mark.timeout(120)


async def test_concurrent_batches_lose_no_acknowledgement(tmp_path, recorder_cls):
    from reloadd import Reloader

    root = tmp_path / "root"
    root.mkdir()
    for i in range(3000):
        (root / f"f{i:04d}").write_text(str(i))
    first = recorder_cls([root], concurrency=8)
    async with Reloader(config_for(tmp_path), consumers=[first]) as r:
        for s in r.engine.slots.values():
            s.queue.max_batch = 16
            s.records._compact_after = 1000  # compactions happen while batches finish
        await first.wait_for(lambda x: len(x.changes) == 3000, timeout=60)
        await r.wait_idle(60)
    again = recorder_cls([root])
    async with Reloader(config_for(tmp_path), consumers=[again]) as r:
        await r.wait_idle(60)
    assert again.changes == []


async def test_directory_made_during_overflow_is_watched(tmp_path, recorder_cls, start_reloader):
    from .test_watch import sysctl

    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    rec.gate = asyncio.Event()
    with sysctl("fs.inotify.max_queued_events", 32):
        r = await start_reloader(rec, rescan_interval="0s")
        (root / "first").write_text("x")
        await asyncio.wait_for(rec.entered.wait(), 10)

        def burst() -> None:
            for i in range(500):
                (root / f"f{i}").write_text(str(i))
            (root / "late").mkdir()

        burst()  # on the loop thread on purpose: the queue overflows before anything reads it
        rec.gate.set()
        await rec.wait_for(lambda x: len(x.changes) >= 501, timeout=30)
        await r.wait_idle(30)
        assert r.engine.stats.overflows >= 1
        (root / "late" / "app.conf").write_text("needs the re-armed watch")
        await rec.wait_path(root / "late" / "app.conf")


async def test_file_root_parent_swapped(tmp_path, recorder_cls, start_reloader):
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    target = conf_d / "app.conf"
    target.write_text("v1")
    rec = recorder_cls([target])
    await start_reloader(rec)
    await rec.wait_path(target)
    new = tmp_path / "conf.d.new"
    new.mkdir()
    (new / "app.conf").write_text("v2 from the new directory")
    os.rename(conf_d, tmp_path / "conf.d.old")
    os.rename(new, conf_d)
    await rec.wait_path(target, 2)
    (conf_d / "app.conf").write_text("v3 edited after the swap")
    await rec.wait_path(target, 3)
    ((tmp_path / "conf.d.old") / "app.conf").write_text("edits in the old directory are not ours")
    (conf_d / "app.conf").write_text("v4")
    await rec.wait_path(target, 4)
    assert rec.changes_for(target)[-1].fingerprint == Fingerprint.from_stat(os.stat(target))
    assert len(rec.changes_for(target)) == 4


async def test_symlinked_root_and_retarget(tmp_path, recorder_cls, start_reloader):
    r1 = tmp_path / "releases" / "1"
    r2 = tmp_path / "releases" / "2"
    r1.mkdir(parents=True)
    r2.mkdir(parents=True)
    (r1 / "pre.conf").write_text("present at start")
    (r2 / "pre.conf").write_text("release two")
    current = tmp_path / "current"
    current.symlink_to(r1)
    rec = recorder_cls([current])
    await start_reloader(rec)
    await rec.wait_path(current / "pre.conf")
    tmp = tmp_path / "current.tmp"
    tmp.symlink_to(r2)
    os.replace(tmp, current)  # ln -sfn
    await rec.wait_path(current / "pre.conf", 2)
    assert rec.changes_for(current / "pre.conf")[-1].kind is ChangeKind.MODIFIED
    (r2 / "new.conf").write_text("written in the new target")
    await rec.wait_path(current / "new.conf")


async def test_file_root_symlink_outside_its_parent(tmp_path, recorder_cls, start_reloader):
    real = tmp_path / "run" / "resolv.conf"
    real.parent.mkdir()
    real.write_text("nameserver 127.0.0.1")
    etc = tmp_path / "etc"
    etc.mkdir()
    link = etc / "resolv.conf"
    link.symlink_to(real)
    rec = recorder_cls([link])
    await start_reloader(rec)
    await rec.wait_path(link)


async def test_raising_accepts_does_not_stop_others(tmp_path, recorder_cls, start_reloader, caplog):
    root = tmp_path / "root"
    root.mkdir()

    class Buggy(recorder_cls):
        def accepts(self, path: Path) -> bool:
            raise ValueError("plugin bug")

    good = recorder_cls([root], name="good")
    await start_reloader(Buggy([root], name="buggy"), good)
    (root / "a.conf").write_text("a")
    await good.wait_path(root / "a.conf")
    assert "Failed to filter" in caplog.text and "plugin bug" in caplog.text


async def test_created_and_still_open_is_held(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    r = await start_reloader(rec)
    target = root / "download.tar"
    fh = open(target, "wb")
    try:
        await asyncio.sleep(0.5)  # a slow producer: nothing written yet, well past quiet
        fh.write(b"complete content")
    finally:
        fh.close()
    await rec.wait_path(target)
    await r.wait_idle(10)
    assert [(c.kind, c.fingerprint.size) for c in rec.changes_for(target)] == [(ChangeKind.ADDED, 16)]


async def test_rescans_do_not_reset_backoff(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    rec.results = lambda change: Retry("down")
    r = await start_reloader(rec, rescan_interval="200ms")
    for s in r.engine.slots.values():
        s.queue._delay = lambda attempt: 3.0
    (root / "a.conf").write_text("a")
    await rec.wait_path(root / "a.conf")
    await asyncio.sleep(2.0)  # ten rescans find the unacknowledged file again
    assert len(rec.changes_for(root / "a.conf")) == 1


def test_torn_journal_line_does_not_swallow_the_next(tmp_path):
    s = RecordStore(tmp_path / "st")
    s.load()
    s.put(Path("/a"), PathRecord(Fingerprint(1, 1, 1, 1)))
    s.flush()
    journal = next((tmp_path / "st").glob("records.journal.*"))
    with open(journal, "a") as fh:
        fh.write('{"p": "/b", "r"')  # crash mid-line
    t = RecordStore(tmp_path / "st")
    t.load()
    t.put(Path("/c"), PathRecord(Fingerprint(2, 2, 2, 2)))
    t.flush()
    u = RecordStore(tmp_path / "st")
    u.load()
    assert sorted(map(str, u)) == ["/a", "/c"]
    shutil.rmtree(tmp_path / "st")
