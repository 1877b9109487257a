"""Content digests of every size of file: small ones read on the loop a slice at a time, bigger ones in a thread."""

from __future__ import annotations

import hashlib
import os

import pytest

from reloadd._engine import _SLICE, _SMALL

pytestmark = pytest.mark.timeout(60)


async def test_each_file_is_handed_over_with_its_content_digest_whatever_its_size(
        tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    r = await start_reloader(rec, rescan_interval="0s")
    sizes = [0, 1, _SMALL - 1, _SMALL, _SMALL + 1, 1 << 20]
    contents = {root / f"sized-{n}": os.urandom(n) for n in sizes}
    # More small files than one slice: read over several turns of the loop, none skipped.
    contents.update({root / f"many-{i:04d}": os.urandom(1 + i % 64) for i in range(2 * _SLICE + 7)})
    for path, data in contents.items():
        path.write_bytes(data)
    await rec.wait_for(lambda rc: all(rc.changes_for(p) for p in contents), timeout=30)
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
