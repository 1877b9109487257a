"""A rescan leaves a path that is settling to its settling, and takes up a held removal's file.

A walk that meets a path the aggregator holds adds nothing: the aggregator probes the path after
the walk's stat anyway. Observed again, every settling path of a burst went through the walk's
filter and back into the aggregator (a second of CPU for 100,000 paths, and a moved-in file lost
its hand-over at once). Asserted on a real file system with the walk the engine runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from reloadd._filters import PathFilter
from reloadd._pipeline._changes import UNSEEN, View, diff
from reloadd._state._packed import pack_record, pack_stat
from reloadd._types import Fingerprint, PathRecord


def _record(p: Path) -> bytes:
    return pack_record(PathRecord(Fingerprint.from_stat(os.stat(p)), "ab" * 32))


def _stat(p: Path) -> bytes:
    st = os.stat(p)
    return pack_stat(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def test_a_walk_observes_what_differs_but_not_what_is_settling(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    names = ["edited-settling", "edited", "new-settling", "new", "same", "held-removal"]
    paths = {n: root / f"{n}.conf" for n in names}
    for p in paths.values():
        p.write_text("v1")
    records = {str(paths[n]): _record(paths[n]) for n in ("edited-settling", "edited", "same", "held-removal")}
    for n in ("edited-settling", "edited"):
        paths[n].write_text("v2, longer")
    settling = {("c", str(paths["edited-settling"])), ("c", str(paths["new-settling"]))}
    asked: list[tuple[str, str]] = []

    def is_settling(key: tuple[str, str]) -> bool:
        asked.append(key)
        return key in settling

    view = View("c", PathFilter((root,)), {}, records, lambda key, default: default, is_settling,
                prune_held=frozenset({str(paths["held-removal"])}))
    found = diff([(str(root), str(root), True)], [view], None, False)

    assert found.observe["c"] == {
        str(paths["edited"]): _stat(paths["edited"]),
        str(paths["new"]): _stat(paths["new"]),
        str(paths["held-removal"]): _stat(paths["held-removal"]),  # its file is there: taken up again
    }
    assert ("c", str(paths["same"])) not in asked  # as acknowledged: nothing to ask


def test_a_covered_walk_lists_a_settling_new_file_without_observing_it(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    old, settling_new, new = root / "old.conf", root / "settling.conf", root / "new.conf"
    for p in (old, settling_new, new):
        p.write_text("x")
    records = {str(old): _record(old)}
    view = View("c", PathFilter((root,)), {}, records, lambda key, default: default,
                lambda key: key == ("c", str(settling_new)))
    covered = frozenset({str(root)})
    not_due = (1 << 20, (os.stat(root).st_ino + 1) % (1 << 20))  # listed, no file stat-ed
    found = diff([(str(root), str(root), True)], [view], None, False, covered, not_due)

    assert found.observe["c"] == {str(new): UNSEEN}
