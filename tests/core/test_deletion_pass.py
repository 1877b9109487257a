"""A rescan that misses recorded paths names the gone ones by listing the tree, not by stat-ing it again.

When a walk met fewer recorded paths than there are (a removal inotify did not report, or removals
still settling: every periodic rescan during a burst of deletions), it goes over the tree once more
to tell which are gone. Which paths are there is what a scan would find, told from the directory
entries' types: symlinks are resolved as a scan resolves them, and a path that is no longer a
regular file (a FIFO swapped in) is gone all the same.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reloadd._filters import PathFilter
from reloadd._pipeline._changes import Diff, View, diff
from reloadd._pipeline._scan import present, scan
from reloadd._state._packed import pack_record
from reloadd._types import Fingerprint, PathRecord


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    outside = tmp_path / "outside.conf"
    outside.write_text("o")
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "..2024_01_01" / "x").mkdir(parents=True)  # kubelet's bookkeeping: never a path of its own
    for rel in ("a.conf", "b.conf", "sub/c.conf", "sub/deeper/d.conf", "..2024_01_01/x/e.conf", "..hidden"):
        (root / rel).write_text(rel)
    os.symlink("a.conf", root / "to-a.conf")  # inside the root: a path
    os.symlink(outside, root / "out.conf")  # out of the root: refused
    os.symlink("missing.conf", root / "dangling.conf")  # dangling: as good as absent
    os.symlink("sub", root / "to-sub")  # a directory: not followed
    os.symlink("..2024_01_01", root / "..data")
    os.mkfifo(root / "fifo.conf")
    return root


@pytest.mark.parametrize("recursive", [True, False])
def test_what_is_present_is_what_a_scan_finds(tmp_path, recursive):
    root = _tree(tmp_path)
    found: dict[str, bytes] = {}
    scan(str(root), str(root), recursive, found, {})
    assert present(str(root), str(root), recursive) == set(found)
    assert str(root / "to-a.conf") in found and str(root / "out.conf") not in found  # the tree is what it says
    assert (str(root / "sub" / "c.conf") in found) is recursive


def test_a_file_root_and_a_symlinked_root(tmp_path):
    root = _tree(tmp_path)
    link = tmp_path / "link-root"
    os.symlink(root, link)
    for top in (str(root / "a.conf"), str(link)):
        found: dict[str, bytes] = {}
        scan(top, top, True, found, {})
        assert present(top, top, True) == set(found) != set()
    assert present(str(tmp_path / "nowhere"), str(tmp_path / "nowhere"), True) == set()


def test_the_deletion_pass_names_what_went_and_stats_no_file_again(tmp_path, monkeypatch):
    root = _tree(tmp_path)
    keep = [root / "b.conf", root / "sub" / "c.conf", root / "to-a.conf"]
    gone = [root / "a.conf", root / "sub" / "deeper" / "d.conf"]
    records = {str(p): pack_record(PathRecord(Fingerprint.from_stat(os.stat(p)))) for p in keep + gone}
    records[str(root / "fifo.conf")] = pack_record(PathRecord(Fingerprint(1, 1, 1, 1)))  # a file, then a FIFO
    for p in gone:
        p.unlink()
    (root / "to-a.conf").unlink()
    os.symlink("b.conf", root / "to-a.conf")  # retargeted: still there

    stats: list[str] = []
    real = os.lstat

    def counting(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        stats.append(os.fsdecode(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", counting)
    view = View("c", PathFilter((root,)), {}, records, lambda key, default: default, lambda key: False)
    out: Diff = diff([(str(root), str(root), True)], [view], None, False)

    judged_gone = {key for key, seen in out.observe["c"].items() if seen is None}
    assert judged_gone == {str(p) for p in gone} | {str(root / "fifo.conf")}
    assert str(root / "to-a.conf") in out.observe["c"]  # met, with its new target's stat: not gone
    regular = [name for name in stats if name.endswith(".conf") and "/" not in name and name != "fifo.conf"]
    assert sorted(regular) == sorted(set(regular)), "a regular file was stat-ed twice: once by the walk, once more"
