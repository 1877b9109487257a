"""Hostile things dropped into a watched folder: each named in a clear warning, the rest still served."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from reloadd import ChangeKind
from reloadd._state._persisted import RETRY

pytestmark = pytest.mark.timeout(60)


async def test_fifo_device_and_escaping_symlinks(tmp_path, recorder_cls, start_reloader, caplog):
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "secret.conf"
    outside.write_text("not yours")
    rec = recorder_cls([root])
    await start_reloader(rec)
    os.mkfifo(root / "pipe.conf")  # opening it for a digest would hang a naive watcher
    os.mknod(root / "null.conf", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    os.symlink(outside, root / "escape.conf")
    os.symlink("loop-b.conf", root / "loop-a.conf")
    os.symlink("loop-a.conf", root / "loop-b.conf")
    (root / "good.conf").write_text("served")
    await rec.wait_path(root / "good.conf")
    sentinel = root / "zz.conf"
    sentinel.write_text("after")
    await rec.wait_path(sentinel)
    assert {c.path.name for c in rec.changes} == {"good.conf", "zz.conf"}
    assert f"Ignoring {root / 'pipe.conf'}: not a regular file" in caplog.text
    assert f"Ignoring {root / 'null.conf'}: not a regular file" in caplog.text
    assert f"Ignoring {root / 'escape.conf'}: symlink resolves to {outside}, outside the watched root" in caplog.text
    assert f"Ignoring {root / 'loop-a.conf'}: cannot resolve symlink" in caplog.text


async def test_non_utf8_names_survive_state_and_restart(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    raw = os.fsencode(root) + b"/caf\xe9-\xff.conf"  # Latin-1 bytes: not valid UTF-8
    with open(raw, "wb") as fh:
        fh.write(b"x")
    path = Path(os.fsdecode(raw))
    rec = recorder_cls([root])
    r = await start_reloader(rec)
    await rec.wait_path(path)
    assert rec.changes_for(path)[0].kind is ChangeKind.ADDED
    await r.close()
    again = recorder_cls([root])
    r2 = await start_reloader(again)
    await r2.wait_idle(10)
    assert again.changes == []  # acknowledged before the restart: not redone
    os.unlink(raw)
    await again.wait_path(path)
    assert again.changes_for(path)[0].kind is ChangeKind.DELETED


async def test_state_files_are_private(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.conf").write_text("a")
    rec = recorder_cls([root])
    r = await start_reloader(rec)
    await rec.wait_path(root / "a.conf")
    await r.wait_idle(10)
    state = tmp_path / "state" / "consumers" / "rec"
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    for f in state.iterdir():
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f


async def test_state_dir_on_a_full_disk(tmp_path, recorder_cls, start_reloader, caplog):
    """The disk fills up: a clear error, the previous state intact, service goes on, and catches up."""
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(state)], check=True)
    try:
        root = tmp_path / "root"
        root.mkdir()
        rec = recorder_cls([root])
        r = await start_reloader(rec)
        (root / "first.conf").write_text("1")
        await rec.wait_path(root / "first.conf")
        await r.wait_idle(10)
        filler = state / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:  # fill the disk
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        journal = next((state / "consumers" / "rec").glob("records.journal.*"))
        before = journal.read_bytes()
        second = [root / f"second-{i:03d}-{'x' * 100}.conf" for i in range(60)]  # > one page of journal
        for p in second:
            p.write_text("2")
        await rec.wait_for(lambda x: set(second) <= {c.path for c in x.changes})
        await r.wait_idle(10)
        assert "Failed to persist state of consumer rec" in caplog.text
        assert "No space left on device" in caplog.text
        after = journal.read_bytes()
        # The previous state intact and no torn line: a batch small enough to fit the slack of the journal's last
        # page may still have been appended whole, nothing else.
        assert after.startswith(before) and after.endswith(b"\n")
        assert all(json.loads(line)["p"] for line in after.splitlines())
        assert len(after.splitlines()) < 1 + len(second)
        filler.unlink()
        (root / "third.conf").write_text("3")
        await rec.wait_path(root / "third.conf")
        await r.wait_idle(10)
        # Writes that failed are retried after a backoff (0.5 s doubling to 15 s, reloadd._state._persisted.RETRY),
        # not at once: the catch-up lands within one backoff of the disk being freed.
        deadline = time.monotonic() + RETRY.maximum + 5
        while True:
            text = journal.read_text()
            if all(p.name in text for p in second):
                break
            assert time.monotonic() < deadline, "the acknowledgements were not persisted once space was freed"
            await asyncio.sleep(0.2)  # the journal is written by a thread of the daemon: nothing to wait on
        lines = text.splitlines()
        assert all(any(p.name in x for x in lines) for p in second)
        assert any("third.conf" in x for x in lines)
    finally:
        await r.close()
        subprocess.run(["umount", str(state)], check=True)
