"""A periodic rescan does not list a covered directory whose names cannot have changed.

A directory's modification time moves with every name created, removed or renamed in it, so a
covered directory whose times are those of its last listing holds the same names: the walk keeps
only the names that are no regular file (stat-ed every time) and takes the listing as it was.
What the walk must still do, and where it must not trust the memo, is asserted here on a real
file system.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from reloadd._filters import PathFilter
from reloadd._pipeline._changes import Diff, View, diff
from reloadd._pipeline._scan import Listing, Trust, local_devices, scan
from reloadd._state._packed import pack_record, pack_stat
from reloadd._types import Fingerprint, PathRecord

PAST = time.time() - 3600  # directory times an hour old: a listing of them is kept


def age(*dirs: Path) -> None:
    for d in dirs:
        os.utime(d, (PAST, PAST))


def walk(root: Path, listings: dict[str, Listing], turn: int | None = None) -> tuple[dict, set[str], Trust]:
    """One covered walk of ``root`` (every directory taken as watched); ``turn``: the share that is due."""
    dirs = frozenset(str(p) for p in [root, *root.rglob("*")] if p.is_dir() and not p.is_symlink())
    shares = 1 << 20
    turns = {os.stat(d).st_ino % shares for d in dirs}
    share = turn if turn is not None else next(i for i in range(shares) if i not in turns)  # no directory's turn
    trust = Trust(dirs, local_devices(), shares, share, listings)
    found: dict = {}
    listed: set[str] = set()
    scan(str(root), str(root), True, found, {}, None, trust, listed)
    return found, listed, trust


def test_an_unchanged_directory_is_not_listed_again(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    for i in range(5):
        (root / f"{i}.conf").write_text("x")
    (root / "sub" / "deep.conf").write_text("x")
    os.symlink("0.conf", root / "link.conf")
    age(root, root / "sub")
    listings: dict[str, Listing] = {}

    found, listed, trust = walk(root, listings)
    assert trust.skipped == set()  # nothing kept yet: listed
    assert {Path(p).name for p in listed} == {f"{i}.conf" for i in range(5)} | {"deep.conf"}
    assert str(root) in listings and str(root / "sub") in listings

    (root / "0.conf").write_text("changed in place: the directory's times do not move")
    found, listed, trust = walk(root, listings)
    assert trust.skipped == {str(root), str(root / "sub")}
    assert listed == set()
    # What is no regular file is looked at every time: the sub-directory is walked, the symlink probed.
    assert str(root / "link.conf") in found
    assert found[str(root / "link.conf")] == pack_stat(*Fingerprint.from_stat(os.stat(root / "0.conf")))


def test_a_name_created_or_removed_makes_the_directory_listed_again(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.conf").write_text("x")
    age(root)
    listings: dict[str, Listing] = {}
    walk(root, listings)
    (root / "b.conf").write_text("new")
    _, listed, trust = walk(root, listings)
    assert trust.skipped == set() and str(root / "b.conf") in listed
    # Just changed: the kernel's coarse clock could give the next change the same time, so that
    # listing is not kept and the next walk lists the directory again.
    assert str(root) not in listings
    (root / "a.conf").unlink()
    _, listed, trust = walk(root, listings)
    assert trust.skipped == set() and listed == {str(root / "b.conf")}


def test_on_its_turn_a_directory_is_listed_and_every_file_stat_ed(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.conf").write_text("x")
    age(root)
    listings: dict[str, Listing] = {}
    walk(root, listings)
    found, listed, trust = walk(root, listings, turn=os.stat(root).st_ino % (1 << 20))
    assert trust.skipped == set() and listed == set()
    assert set(found) == {str(root / "a.conf")}


def test_a_rescan_that_skips_a_directory_finds_no_record_gone_and_a_removal_once_listed(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    paths = [root / f"{i}.conf" for i in range(3)]
    for p in paths:
        p.write_text("x")
    age(root)
    records = {str(p): pack_record(PathRecord(Fingerprint.from_stat(os.stat(p)))) for p in paths}
    listings: dict[str, Listing] = {}

    def rescan() -> list[tuple[str, str, object]]:
        view = View("c", PathFilter((root,)), {}, records, lambda key, default: default, lambda key: False)
        dirs = frozenset({str(root)})
        share = (1 << 20, (os.stat(root).st_ino + 1) % (1 << 20))
        return _flat(diff([(str(root), str(root), True)], [view], None, False, dirs, share, listings))

    assert rescan() == []  # listed: every record met
    assert rescan() == []  # not listed: its records are all there, none is judged gone
    paths[0].unlink()
    assert rescan() == [("c", str(paths[0]), None)]


def _flat(found: Diff) -> list[tuple[str, str, object]]:
    """(consumer, path, seen) for every path the walk says to look at."""
    return [(name, key, seen) for name, seen_by_path in found.observe.items() for key, seen in seen_by_path.items()]


class _Counted(dict[str, bytes]):
    """Records that count how often a walk goes over all of them."""

    reads = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.reads += 1
        return super().__iter__()


def test_an_idle_rescan_does_not_go_over_every_record_and_still_finds_a_directory_gone(tmp_path):
    root = tmp_path / "root"
    paths = [root / d / f"{i}.conf" for d in ("a", "b") for i in range(3)]
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x")
    age(root, root / "a", root / "b")
    records = _Counted({str(p): pack_record(PathRecord(Fingerprint.from_stat(os.stat(p)))) for p in paths})
    listings: dict[str, Listing] = {}
    recorded: dict = {}

    def rescan(version: int) -> list[tuple[str, str, object]]:
        view = View("c", PathFilter((root,)), {}, records, lambda key, default: default, lambda key: False,
                    keys_version=version)
        dirs = frozenset(str(d) for d in (root, root / "a", root / "b") if d.exists())
        share = (1 << 20, max(os.stat(d).st_ino for d in dirs) + 1)  # no directory's turn
        return _flat(diff([(str(root), str(root), True)], [view], None, False, dirs, share, listings,
                          recorded=recorded))

    assert rescan(1) == [] and records.reads  # listed: every record met, and counted per directory
    reads = records.reads
    assert rescan(1) == [] and records.reads == reads  # nothing listed, the same keys: the counts as kept
    assert rescan(2) == [] and records.reads > reads  # a path added or dropped since: the records read again
    for p in paths[3:]:
        p.unlink()
    (root / "b").rmdir()
    os.utime(root, (PAST, PAST))  # the root's times as they were: it is not listed either
    gone = rescan(2)
    assert sorted(gone) == [("c", str(p), None) for p in paths[3:]]  # the kept counts miss directory b's


def test_a_rescan_that_stats_files_counts_them_without_going_over_every_record(tmp_path):
    # The counts kept across walks (the same keys, nothing queued) also serve a walk that stats a directory on its
    # turn: each recorded path it meets is counted where it is met, and a record gone without its event is still
    # found.
    root = tmp_path / "root"
    paths = [root / d / f"{i}.conf" for d in ("a", "b") for i in range(3)]
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x")
    age(root, root / "a", root / "b")
    records = _Counted({str(p): pack_record(PathRecord(Fingerprint.from_stat(os.stat(p)))) for p in paths})
    listings: dict[str, Listing] = {}
    recorded: dict = {}
    shares = 1 << 20

    def rescan(due: Path | None) -> list[tuple[str, str, object]]:
        view = View("c", PathFilter((root,)), {}, records, lambda key, default: default, lambda key: False,
                    keys_version=1)
        dirs = frozenset(str(d) for d in (root, root / "a", root / "b"))
        turn = os.stat(due).st_ino % shares if due is not None else max(os.stat(d).st_ino for d in dirs) + 1
        return _flat(diff([(str(root), str(root), True)], [view], None, False, dirs, (shares, turn), listings,
                          recorded=recorded))

    assert rescan(None) == []  # listed, counted per directory and kept
    reads = records.reads
    assert rescan(root / "a") == [] and rescan(root / "b") == []  # each stat-ed on its turn, every record met
    assert records.reads == reads  # ... without a pass over every record
    paths[4].unlink()  # a removal whose event was lost: its record is still there, the keys the same
    assert rescan(root / "b") == [("c", str(paths[4]), None)]
