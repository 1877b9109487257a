"""The watch survives what kills the peers' watches: lost roots, overflow, limits, crashes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import reloadd._pipeline._scan
from reloadd import ChangeKind, Reason
from tests.waiting import until

pytestmark = pytest.mark.timeout(120)


@contextlib.contextmanager
def sysctl(name: str, value: int):
    path = Path("/proc/sys") / name.replace(".", "/")
    old = path.read_text().strip()
    path.write_text(str(value))
    try:
        yield
    finally:
        path.write_text(old)


async def test_root_deleted_recreated_and_written(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.conf").write_text("a")
    rec = recorder_cls([root])
    r = await start_reloader(rec)
    await rec.wait_path(root / "a.conf")
    shutil.rmtree(root)
    guard = r.engine.slots["rec"].queue.guard
    await until(lambda: str(root / "a.conf") in guard.held)  # a vanished root: its removal is held (#21)
    root.mkdir()
    (root / "b.conf").write_text("written after recreation")
    await rec.wait_path(root / "b.conf")
    assert rec.changes_for(root / "b.conf")[0].kind is ChangeKind.ADDED
    assert [c.kind for c in rec.changes_for(root / "a.conf")] == [ChangeKind.ADDED]  # never handed over deleted


async def test_root_missing_at_start_is_picked_up(tmp_path, recorder_cls, start_reloader, caplog):
    root = tmp_path / "later" / "deeper" / "root"
    rec = recorder_cls([root])
    await start_reloader(rec)
    assert "does not exist yet" in caplog.text
    root.mkdir(parents=True)
    (root / "x.conf").write_text("x")
    await rec.wait_path(root / "x.conf")


async def test_file_root(tmp_path, recorder_cls, start_reloader):
    conf = tmp_path / "registries.conf"
    rec = recorder_cls([conf])
    await start_reloader(rec)
    (tmp_path / "sibling.conf").write_text("not mine")
    conf.write_text("mine")
    await rec.wait_path(conf)
    conf.unlink()
    await rec.wait_path(conf, 2)
    assert [c.kind for c in rec.changes_for(conf)] == [ChangeKind.ADDED, ChangeKind.DELETED]
    assert {c.path for c in rec.changes} == {conf}


async def test_new_subdirectory_files_made_before_the_watch(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    await start_reloader(rec)
    staging = tmp_path / "staging"
    (staging / "deep").mkdir(parents=True)
    for i in range(20):
        (staging / "deep" / f"f{i}.conf").write_text(str(i))
    os.rename(staging, root / "sub")  # a whole tree arrives at once
    expected = {root / "sub" / "deep" / f"f{i}.conf" for i in range(20)}
    await rec.wait_for(lambda r: expected <= {c.path for c in r.changes})
    (root / "sub" / "deep" / "late.conf").write_text("late")  # and the new dirs are watched
    await rec.wait_path(root / "sub" / "deep" / "late.conf")


_WRITER = """
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    fd = os.open(os.path.join(root, f"f{i:05d}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"%d" % i)
    os.close(fd)
"""


async def test_overflow_loses_nothing(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    with sysctl("fs.inotify.max_queued_events", 64):
        r = await start_reloader(rec, rescan_interval="0s")  # only the overflow rescan can save us
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(root), "5000"])  # noqa: ASYNC220 (the loop must block)
        # The loop thread holds the GIL in one C call until the writer is done: nobody reads the
        # inotify queue (the reader thread needs the GIL too), so its 64 events overflow.
        values = [random.random() for _ in range(2_000_000)]
        while writer.poll() is None:
            values.sort(reverse=values[0] < values[-1])
        assert writer.returncode == 0
        expected = {root / f"f{i:05d}" for i in range(5000)}
        await rec.wait_for(lambda r: expected <= {c.path for c in r.changes}, timeout=60)
        assert r.engine.stats.overflows >= 1
    for p in expected:
        assert rec.changes_for(p)[-1].fingerprint is not None


async def test_a_loss_during_a_walk_stops_it_and_the_new_walk_finds_everything(
        tmp_path, recorder_cls, start_reloader, monkeypatch):
    """Events lost while a walk of every root runs (an overflow in a storm): that walk may already have
    passed where they were lost, so it stops at its next chunk and the loss's own walk starts at once,
    instead of after it. What the stopped walk met is kept; what it could not judge (a deletion needs the
    whole tree) the new walk does. Without inotify, only walks see changes here."""
    import threading

    import reloadd._pipeline._changes
    from reloadd._source import EventKind, SourceEvent

    root = tmp_path / "root"
    root.mkdir()
    files = [root / f"f{i}.conf" for i in range(6)]
    for f in files:
        f.write_text("v1")
    rec = recorder_cls([root])
    r = await start_reloader(rec, inotify=False, rescan_interval="1h")
    await rec.wait_for(lambda got: set(files) <= {c.path for c in got.changes}, timeout=10)
    entered, release = threading.Event(), threading.Event()
    real, calls = reloadd._pipeline._changes.scan, []

    def held_walk(*args, **kwargs):  # the first walk is held at its start until the test has lost events
        calls.append(args[9:] or kwargs.get("start"))
        if len(calls) == 1:
            entered.set()
            release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(reloadd._pipeline._changes, "scan", held_walk)
    eng = r.engine
    walks = eng.stats.rescans
    eng.emit(SourceEvent(EventKind.RESCAN, None, "inotify", lost_at=time.monotonic()))
    assert await asyncio.to_thread(entered.wait, 10)
    files[0].unlink()  # its event lost with the rest
    files[1].write_text("v2, longer")
    eng.emit(SourceEvent(EventKind.RESCAN, None, "inotify", lost_at=time.monotonic()))
    release.set()
    await rec.wait_for(lambda got: any(c.kind is ChangeKind.DELETED for c in got.changes_for(files[0]))
                       and got.changes_for(files[1])[-1].fingerprint.size == len("v2, longer"), timeout=10)
    await r.wait_idle(10)
    assert eng.stats.restarted_rescans == 1
    assert eng.stats.rescans == walks + 2  # the stopped walk and the whole one after it...
    assert calls[1] and str(root) in calls[1][0]  # ...which went on from where the stopped one was
    assert not any(c.kind is ChangeKind.DELETED for f in files[1:] for c in rec.changes_for(f))


async def test_a_walks_findings_are_handed_over_while_it_still_walks(tmp_path, recorder_cls, start_reloader,
                                                                     monkeypatch):
    """A rescan's findings flow out as it walks, not after it: the walk is held after its first chunk of
    names until the consumer has what that chunk found, which it gets while the walk is still under way."""
    import threading

    import reloadd._pipeline._changes
    import reloadd._pipeline._scan
    from reloadd._source import EventKind, SourceEvent

    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    r = await start_reloader(rec, inotify=False, rescan_interval="1h")
    files = [root / f"f{i:03d}.conf" for i in range(60)]
    for f in files:
        f.write_text("new")  # no watch: only the walk can find them
    monkeypatch.setattr(reloadd._pipeline._scan, "SCAN_CHUNK", 10)
    takes, delivered, ended = [], threading.Event(), threading.Event()
    real_take, real_scan = reloadd._pipeline._changes._Compare.take, reloadd._pipeline._changes.scan

    def take(self, found, listed):  # type: ignore[no-untyped-def]
        real_take(self, found, listed)
        takes.append(len(found))
        if len(takes) == 2:  # the first chunk is out: hold the walk until the consumer has some of it
            delivered.wait(10)

    def scan(*args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return real_scan(*args, **kwargs)
        finally:
            ended.set()

    monkeypatch.setattr(reloadd._pipeline._changes._Compare, "take", take)
    monkeypatch.setattr(reloadd._pipeline._changes, "scan", scan)
    r.engine.emit(SourceEvent(EventKind.RESCAN, None, "rescan"))
    await rec.wait_for(lambda got: any(c.path in files for c in got.changes), timeout=8)
    assert not ended.is_set()  # handed over while the walk was held part-way
    delivered.set()
    await rec.wait_for(lambda got: set(files) <= {c.path for c in got.changes}, timeout=10)
    await r.wait_idle(10)
    assert all(len(rec.changes_for(f)) == 1 for f in files)  # each once: nothing handed over twice


async def test_a_busy_loop_does_not_make_the_kernel_queue_overflow(tmp_path, recorder_cls, start_reloader):
    """Events are read by a thread of their own: a loop busy for a second (settling a burst, say)
    while 10,000 files are written (30,000 events, twice the kernel queue) costs no overflow rescan."""
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    with sysctl("fs.inotify.max_queued_events", 16384):
        r = await start_reloader(rec)
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(root), "10000"])  # noqa: ASYNC220 (the loop is kept busy)
        end = time.monotonic() + 1.0
        while time.monotonic() < end or writer.poll() is None:
            pass  # Python work on the loop: the GIL is handed to other threads every switch interval
        assert writer.wait() == 0
        expected = {root / f"f{i:05d}" for i in range(10000)}
        await rec.wait_for(lambda r: expected <= {c.path for c in r.changes}, timeout=60)
        assert r.engine.stats.overflows == 0


async def test_watch_failure_is_rebuilt_and_nothing_lost(tmp_path, recorder_cls, start_reloader, caplog):
    from reloadd._sources.inotify import InotifySource

    root = tmp_path / "root"
    root.mkdir()
    outage = root / "during-outage.conf"
    kill = asyncio.Event()
    runs: list[object] = []

    class Flaky(InotifySource):
        async def run(self) -> None:
            runs.append(self)
            if len(runs) > 1:
                await super().run()
                return
            inner = asyncio.create_task(super().run())
            await kill.wait()
            outage.write_text("written while the watch dies")  # its event dies with the instance
            inner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await inner
            raise RuntimeError("injected watch failure")

    rec = recorder_cls([root])
    await start_reloader(rec, sources=[Flaky], rescan_interval="0s")  # no periodic rescan to hide behind
    (root / "before.conf").write_text("1")
    await rec.wait_path(root / "before.conf")
    kill.set()
    await rec.wait_path(outage)  # found by the rescan that follows every rebuild
    assert len(runs) == 2
    assert "rebuilding the watch" in caplog.text
    (root / "after.conf").write_text("the rebuilt watch works")
    await rec.wait_path(root / "after.conf")


async def test_a_change_between_the_failures_rescan_and_the_rebuilt_watch_is_not_lost(
    tmp_path, recorder_cls, start_reloader
):
    from reloadd._sources.inotify import InotifySource

    root = tmp_path / "root"
    root.mkdir()
    kill, arm = asyncio.Event(), asyncio.Event()
    runs: list[object] = []

    class Slow(InotifySource):
        """Fails once; the watch built after it arms only when the test says so."""

        async def run(self) -> None:
            runs.append(self)
            if len(runs) > 1:
                await arm.wait()  # a rebuild that takes a while (a big tree to arm, a loaded node)
                await super().run()
                return
            inner = asyncio.create_task(super().run())
            await kill.wait()
            inner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await inner
            raise RuntimeError("injected watch failure")

    rec = recorder_cls([root])
    r = await start_reloader(rec, sources=[Slow], rescan_interval="0s")  # no periodic rescan to hide behind
    kill.set()
    await until(lambda: len(runs) == 2 and r.engine.idle, what="the failure's rescan done, the rebuild waiting")
    gap = root / "in-the-gap.conf"
    gap.write_text("after the failure's walk, before the new watch")
    arm.set()
    await rec.wait_path(gap)  # the walk once the rebuilt watch is armed finds it
    (root / "after.conf").write_text("the rebuilt watch works")
    await rec.wait_path(root / "after.conf")


async def test_watch_limit_degrades_to_rescans(tmp_path, recorder_cls, start_reloader, caplog):
    root = tmp_path / "root"
    for i in range(30):
        (root / f"d{i}").mkdir(parents=True)
    rec = recorder_cls([root])
    with sysctl("fs.inotify.max_user_watches", 10):
        r = await start_reloader(rec, rescan_interval="300ms")
        assert "fs.inotify.max_user_watches" in caplog.text
        assert r.watch_state.startswith("degraded")
        (root / "d29" / "x.conf").write_text("found by the rescan")
        await rec.wait_path(root / "d29" / "x.conf")
    assert caplog.text.count("fs.inotify.max_user_watches") == 1


@pytest.fixture
def local_dir():
    """A directory on tmpfs: a local file system wherever the tests run (tmp may be an overlay)."""
    d = Path(tempfile.mkdtemp(prefix="reloadd-test-", dir="/dev/shm"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def write_unseen(path: Path, other_link: Path, text: str) -> None:
    """Rewrite ``path`` through a hard link in another directory: no watch on ``path``'s directory hears of it."""
    os.link(path, other_link)
    other_link.write_text(text)
    other_link.unlink()


async def wait_rescans(engine, count: int, covered: bool) -> None:
    stats = engine.stats
    start = stats.covered_rescans if covered else stats.rescans - stats.covered_rescans
    for _ in range(400):
        now = stats.covered_rescans if covered else stats.rescans - stats.covered_rescans
        if now >= start + count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {count} {'covered' if covered else 'full'} rescans ran")


async def start_on_one_file(local_dir, recorder_cls, start_reloader, full_rescan_interval: str):
    """A reloader rescanning every 100 ms over ``root`` holding a.conf (acknowledged); also a directory beside it."""
    root, elsewhere = local_dir / "root", local_dir / "elsewhere"
    elsewhere.mkdir()
    root.mkdir()
    spare = []
    while os.stat(root).st_ino % 36_000 < 2_000:  # "1h" / 100 ms: not the directory's turn in the first 2,000 rescans
        spare.append(root.rename(local_dir / f"spare-{len(spare)}"))
        root.mkdir()
    (root / "a.conf").write_text("1")
    rec = recorder_cls([root])
    r = await start_reloader(rec, rescan_interval="100ms", full_rescan_interval=full_rescan_interval)
    await rec.wait_path(root / "a.conf")
    return r, rec, root, elsewhere


async def test_periodic_rescans_stat_only_their_share_of_watched_files(local_dir, recorder_cls, start_reloader):
    # The cost side of full_rescan_interval: in a directory a live watch has covered since the
    # previous rescan, a periodic rescan stats the files only on the directory's turn (1 in 36,000
    # rescans here), so a change no watch can report waits for that turn.
    r, rec, root, elsewhere = await start_on_one_file(local_dir, recorder_cls, start_reloader, "1h")
    write_unseen(root / "a.conf", elsewhere / "a", "rewritten")
    await wait_rescans(r.engine, 5, covered=True)
    assert len(rec.changes_for(root / "a.conf")) == 1  # covered, and not its turn: not stat-ed
    (root / "c.conf").write_text("what a watch reports is seen at once, as ever")
    await rec.wait_path(root / "c.conf")


async def test_a_change_no_watch_reports_is_found_within_full_rescan_interval(local_dir, recorder_cls, start_reloader):
    r, rec, root, elsewhere = await start_on_one_file(local_dir, recorder_cls, start_reloader, "500ms")
    await wait_rescans(r.engine, 1, covered=True)
    write_unseen(root / "a.conf", elsewhere / "a", "rewritten")
    await rec.wait_path(root / "a.conf", 2)
    assert (root / "a.conf").read_text() == "rewritten"


async def test_the_first_periodic_rescan_lists_no_directory_unchanged_since_start_up(local_dir, recorder_cls,
                                                                                     start_reloader, monkeypatch):
    # The start-up pass lists every directory anyway and keeps the listing of each one a watch covers: the
    # first periodic rescan need not list them again (for 100,000 files in 100 folders, 100,000 entries read).
    root = local_dir / "root"
    dirs = [root / f"d{i}" for i in range(3)]
    for d in dirs:
        d.mkdir(parents=True)
        (d / "a.conf").write_text("x")
    for d in (root, *dirs):
        os.utime(d, (time.time() - 3600,) * 2)  # settled: a listing of them is kept
    rec = recorder_cls([root])
    r = await start_reloader(rec, rescan_interval="0s")
    for d in dirs:
        await rec.wait_path(d / "a.conf")
    r.engine.full_rescan_every = max(os.stat(d).st_ino for d in (root, *dirs)) + 1  # no directory's turn
    listed: list[str] = []
    scandir = os.scandir

    def listing(fd):  # type: ignore[no-untyped-def]
        if isinstance(fd, int):
            listed.append(os.readlink(f"/proc/self/fd/{fd}"))
        return scandir(fd)

    monkeypatch.setattr(reloadd._pipeline._scan.os, "scandir", listing)
    await r.engine.reconcile(None, Reason.RESCAN, periodic=True)
    assert r.engine.stats.covered_rescans == 1
    assert listed == []
    (dirs[1] / "b.conf").write_text("a new name: the directory's times move")
    await rec.wait_path(dirs[1] / "b.conf")
    await r.engine.reconcile(None, Reason.RESCAN, periodic=True)
    assert listed == [str(dirs[1])]


async def test_a_file_moved_into_the_folder_is_handed_over_without_the_quiet_wait(tmp_path, recorder_cls,
                                                                                   start_reloader):
    # Renaming a finished file into the folder is how a complete file is published: for a consumer whose
    # files stand alone (arrival_at_once) there is nothing to wait for. A file written in place still waits
    # out ``quiet`` (30 s here, far beyond the 10 s allowed), and so does a renamed file for a consumer
    # without it (files that go together, gathered by the quiet period).
    root, other, staging = tmp_path / "root", tmp_path / "other", tmp_path / "staging"
    for d in (root, other, staging):
        d.mkdir()
    rec = recorder_cls([root], arrival_at_once=True)
    together = recorder_cls([other], name="together")
    await start_reloader(rec, together, quiet="30s", max_delay="60s")
    (staging / "a.conf").write_text("complete")
    os.rename(staging / "a.conf", root / "a.conf")
    (staging / "c.conf").write_text("complete too")
    os.rename(staging / "c.conf", other / "c.conf")
    await rec.wait_path(root / "a.conf", timeout=10)
    (root / "b.conf").write_text("written in place")
    await asyncio.sleep(2)
    assert rec.changes_for(root / "b.conf") == []
    assert together.changes_for(other / "c.conf") == []


async def test_pump_failure_is_restarted_and_nothing_lost(tmp_path, recorder_cls, start_reloader, caplog):
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    r = await start_reloader(rec, rescan_interval="0s")
    engine = r.engine
    real = engine._process
    failed = []

    async def broken(events):
        if not failed:
            failed.append(events)
            raise RuntimeError("injected pump failure")
        await real(events)

    engine._process = broken
    (root / "a.conf").write_text("its event is in the batch that fails")
    await rec.wait_path(root / "a.conf")
    assert failed and "Source pump failed, rebuilding the watch: injected pump failure" in caplog.text


async def test_file_events_of_one_read_are_folded_per_path(tmp_path):
    # What the engine acts on is the last word per path in a read, in the order the paths came:
    # a file written in one go (CREATE, MODIFY, CLOSE_WRITE) is one WRITTEN, a file created empty
    # whose writer still has it open is WRITING, and a file deleted after its write is GONE.
    import struct

    from asyncinotify import Mask

    from reloadd._source import EventKind, SourceContext, WatchRoot
    from reloadd._sources.inotify import InotifySource

    got: list[tuple[EventKind, object]] = []
    folded: list[int] = []
    ctx = SourceContext(roots=(WatchRoot(tmp_path),),
                        emit=lambda ev: (got.append((ev.kind, ev.path)), folded.append(ev.folded)))
    src = InotifySource(ctx)
    src._by_wd[1] = (object(), f"{tmp_path}/")  # type: ignore[assignment]
    (tmp_path / "held").write_bytes(b"")  # created empty, writer still at work

    def ev(mask: Mask, name: str) -> bytes:
        raw = name.encode() + b"\0" * (16 - len(name))
        return struct.pack("iIII", 1, int(mask), 0, len(raw)) + raw

    await src._handle_buffer(b"".join([
        ev(Mask.CREATE, "whole"), ev(Mask.CREATE, "held"), ev(Mask.MODIFY, "whole"),
        ev(Mask.CREATE, "gone"), ev(Mask.MODIFY, "gone"), ev(Mask.ATTRIB, "whole"),
        ev(Mask.CLOSE_WRITE, "whole"), ev(Mask.CLOSE_WRITE, "gone"), ev(Mask.DELETE, "gone"),
    ]))
    assert got == [
        (EventKind.WRITTEN, f"{tmp_path}/whole"),
        (EventKind.WRITING, f"{tmp_path}/held"),
        (EventKind.GONE, f"{tmp_path}/gone"),
    ]
    assert folded == [3, 0, 3]  # still counted as coalesced (reloadd_changes_coalesced_total)


async def test_consecutive_events_of_one_name_are_one_path_only_in_one_directory(tmp_path):
    # Events of one file in a row (a write: CREATE, MODIFY, CLOSE_WRITE) are taken as the same path without the name
    # decoded again; the same name in another watched directory, or after another path, is its own path.
    import struct

    from asyncinotify import Mask

    from reloadd._source import EventKind, SourceContext, WatchRoot
    from reloadd._sources.inotify import InotifySource

    got: list[tuple[EventKind, object, int]] = []
    ctx = SourceContext(roots=(WatchRoot(tmp_path),), emit=lambda ev: got.append((ev.kind, ev.path, ev.folded)))
    src = InotifySource(ctx)
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").mkdir()
    src._by_wd[1] = (object(), f"{tmp_path}/d1/")  # type: ignore[assignment]
    src._by_wd[2] = (object(), f"{tmp_path}/d2/")  # type: ignore[assignment]

    def ev(wd: int, mask: Mask, name: str) -> bytes:
        raw = name.encode() + b"\0" * (16 - len(name))
        return struct.pack("iIII", wd, int(mask), 0, len(raw)) + raw

    await src._handle_buffer(b"".join([
        ev(1, Mask.CREATE, "a"), ev(1, Mask.MODIFY, "a"), ev(2, Mask.MODIFY, "a"), ev(2, Mask.CLOSE_WRITE, "a"),
        ev(1, Mask.CLOSE_WRITE, "a"), ev(1, Mask.MODIFY, "b"), ev(1, Mask.DELETE, "b"), ev(1, Mask.MODIFY, "b"),
    ]))
    assert got == [
        (EventKind.WRITTEN, f"{tmp_path}/d1/a", 2),
        (EventKind.WRITTEN, f"{tmp_path}/d2/a", 1),
        (EventKind.WRITING, f"{tmp_path}/d1/b", 2),  # modified after its removal: written again
    ]
