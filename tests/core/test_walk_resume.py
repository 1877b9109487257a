"""A walk stopped for a newer loss of events is gone on with, not begun again.

In a storm of inotify overflows every walk of every root may be stopped for the next loss. Begun again
from the top each time, the walks redo the same first directories and reach the last ones only when
the storm lets a walk finish. Resumed, the next walk takes the directories the stopped one had left
first, then walks again those it had walked (events may have been lost there meanwhile): every walk
still meets every directory once, so it can judge deletions. Asserted here on a real file system.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reloadd._filters import PathFilter
from reloadd._pipeline._changes import View, diff
from reloadd._pipeline._scan import WalkStopped, scan
from reloadd._state._packed import pack_record
from reloadd._types import Fingerprint, PathRecord

DIRS = ("a", "b", "c", "d", "e")


class StopAfter:
    """A ``stop`` event that is set once the walk has looked at it ``n`` times (once per directory or chunk)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def is_set(self) -> bool:
        self.n -= 1
        return self.n < 0


def tree(tmp_path: Path) -> tuple[Path, list[Path]]:
    root = tmp_path / "root"
    files = [root / d / f"{i}.conf" for d in DIRS for i in range(3)] + [root / "a" / "sub" / "deep.conf"]
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x")
    return root, files


class Met(dict[str, bytes]):
    """A walk's table that counts how often each path is put in it."""

    def __init__(self) -> None:
        super().__init__()
        self.times: dict[str, int] = {}

    def __setitem__(self, key: str, value: bytes) -> None:
        self.times[key] = self.times.get(key, 0) + 1
        super().__setitem__(key, value)


def dirs_of(found: dict[str, bytes]) -> list[str]:
    """The directories of the paths a walk found, in the order it met them."""
    return list(dict.fromkeys(os.path.dirname(p) for p in found))


def stopped_walk(root: Path, found: dict[str, bytes] | None = None) -> tuple[list[str], list[str]]:
    """Walk ``root`` until stopped part-way: the directories it had left, and those it had walked."""
    with pytest.raises(WalkStopped) as stopped:
        scan(str(root), str(root), True, {} if found is None else found, {}, stop=StopAfter(6))  # type: ignore[arg-type]
    return stopped.value.left, stopped.value.done


def test_a_resumed_walk_goes_on_where_it_stopped_then_walks_the_rest_again(tmp_path):
    root, files = tree(tmp_path)
    first: dict[str, bytes] = {}
    left, done = stopped_walk(root, first)
    assert left and done and not set(left) & set(done)
    assert set(dirs_of(first)) <= set(done) | set(left)

    # Meanwhile (its events lost): a file goes from a directory already walked, one comes where it stopped.
    gone = next(f for f in files if str(f.parent) in done)
    gone.unlink()
    new = Path(left[-1]) / "new.conf"
    new.write_text("y")

    again = Met()
    scan(str(root), str(root), True, again, {}, start=[*done, *left])
    order = dirs_of(again)
    assert order[0] == left[-1]  # it goes on where the stopped walk was...
    walked_again = [order.index(d) for d in done if d in order]
    assert walked_again and min(walked_again) > max(order.index(d) for d in left if d in order)  # ...those last
    everything = {str(f) for f in files if f != gone} | {str(new)}
    assert set(again) == everything  # the whole tree as it is now...
    assert set(again.times.values()) == {1}  # ...each directory walked once


def test_a_rescan_resumed_after_a_stop_judges_a_removal_where_the_stopped_walk_had_been(tmp_path):
    root, files = tree(tmp_path)
    records = {str(f): pack_record(PathRecord(Fingerprint.from_stat(os.stat(f)))) for f in files}
    jobs = [(str(root), str(root), True)]

    def rescan(**kw):  # type: ignore[no-untyped-def]
        view = View("c", PathFilter((root,)), {}, records, lambda key, default: default, lambda key: False)
        return diff(jobs, [view], None, False, **kw)

    stopped = rescan(stop=StopAfter(6))
    assert stopped.stopped and stopped.resume is not None
    assert stopped.observe["c"] == {}  # nothing judged gone part-way
    _, done = stopped_walk(root)  # the same walk, stopped at the same place: what it had walked
    assert stopped.resume.start[:len(done)] == tuple(done)
    victim = next(f for f in files if str(f.parent) in done)
    victim.unlink()  # in a directory the stopped walk had passed, its event lost

    resumed = rescan(resume=stopped.resume)
    assert not resumed.stopped
    assert resumed.observe["c"] == {str(victim): None}  # judged gone; nothing else differs
    assert rescan().observe["c"] == {str(victim): None}  # as a walk from the top says
