"""Content digests of every size of file, read on the loop (a few small files the watch reported) or in a thread."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from reloadd._pipeline._scan import probe, probe_read
from reloadd._pipeline._settle import _ON_LOOP, _SMALL

pytestmark = pytest.mark.timeout(60)


async def test_each_file_is_handed_over_with_its_content_digest_whatever_its_size(
        tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    r = await start_reloader(rec, rescan_interval="0s")
    # A few files, across the size line: the small ones read on the loop, the bigger ones in a thread...
    sized = {root / f"sized-{n}": os.urandom(n) for n in (0, 1, _SMALL - 1, _SMALL, _SMALL + 1, 1 << 20)}
    # ... then a burst of more small files than a step reads on the loop: read in a thread.
    burst = {root / f"many-{i:04d}": os.urandom(1 + i % 64) for i in range(2 * _ON_LOOP + 7)}
    contents: dict[Path, bytes] = {}
    for files in (sized, burst):
        for path, data in files.items():
            path.write_bytes(data)
        await rec.wait_for(lambda rc, files=files: all(rc.changes_for(p) for p in files), timeout=30)
        contents.update(files)
    for path, data in contents.items():
        assert [c.digest for c in rec.changes_for(path)] == [hashlib.sha256(data).hexdigest()], path

    # The same bytes written again: the digest says nothing changed, whichever way it was read.
    for path, data in contents.items():
        path.write_bytes(data)
    sentinel = root / "sentinel"
    sentinel.write_bytes(b"after")
    await rec.wait_path(sentinel)
    await r.wait_idle(20)
    assert {p.name for p in contents if len(rec.changes_for(p)) != 1} == set()


def test_a_probe_that_reads_opens_nothing_but_a_regular_file(tmp_path: Path) -> None:
    """A settling path is probed and, if small, read in one call: a FIFO is still never opened (a writer
    waiting for its reader would be let through, then see the pipe close), and a symlink out of the tree is
    refused as a plain probe refuses it."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    opened = threading.Event()

    def writer() -> None:
        fd = os.open(fifo, os.O_WRONLY)  # blocks until something opens the pipe for reading
        opened.set()
        os.close(fd)

    threading.Thread(target=writer, daemon=True).start()
    pr, digest = probe_read(str(fifo), tmp_path, _SMALL)
    assert (pr, digest) == (probe(fifo, tmp_path), None)
    assert pr.error is not None and "not a regular file" in pr.error
    assert not opened.wait(0.3)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # let the writer go
    try:
        assert opened.wait(5)
    finally:
        os.close(fd)

    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.write_bytes(b"secret")
    link = tmp_path / "link"
    link.symlink_to(outside)
    pr, digest = probe_read(str(link), tmp_path, _SMALL)
    assert digest is None and pr.fingerprint is None
    assert pr.error is not None and str(outside) in pr.error

    small = tmp_path / "small"
    small.write_bytes(b"x" * 100)
    pr, digest = probe_read(str(small), tmp_path, _SMALL)
    assert pr == probe(small, tmp_path) and digest == hashlib.sha256(b"x" * 100).hexdigest()
