"""Persisted state that cannot be read or written: set aside at load, counted and rate-limited when written.

Unit-level companions of ``tests/faults/test_state_disk.py`` and ``test_state_files.py`` (real file systems,
real consumers): the rules themselves, with injected clocks where a minute must pass.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from reloadd import Fingerprint, PathRecord, StateError
from reloadd._filters import PathFilter
from reloadd._ops._terminal import format_status, status_exit_code
from reloadd._pipeline._prune import PruneGuard
from reloadd._state._persisted import PersistHealth
from reloadd._state._records import RecordStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def enospc(path: str = "/state/consumers/x/records.journal.0") -> StateError:
    return StateError(f"Failed to write {path}: No space left on device", path=path, cause="No space left on device")


def test_one_log_line_per_cause_per_minute_with_the_count_suppressed(caplog: pytest.LogCaptureFixture) -> None:
    mono = Clock()
    health = PersistHealth("x", monotonic=mono)
    with caplog.at_level(logging.ERROR, logger="reloadd.state"):
        for _ in range(3000):  # a batch every 20 ms for a minute
            health.failed(enospc())
            mono.now += 0.0199
        health.failed(StateError("Failed to write p: Read-only file system", path="p", cause="Read-only file system"))
        mono.now += 1.0
        health.failed(enospc())
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert "No space left on device" in lines[0] and "more like it" not in lines[0]
    assert "Read-only file system" in lines[1]
    assert "(2999 more like it since the last line, not logged)" in lines[2]
    assert health.write_errors == 3002


def test_retries_back_off_and_a_success_ends_the_streak(caplog: pytest.LogCaptureFixture) -> None:
    mono, wall = Clock(), Clock()
    health = PersistHealth("x", monotonic=mono, clock=wall)
    delays = []
    for _ in range(8):
        health.failed(enospc())
        delays.append(health.retry_in())
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0]
    assert health.note() is not None and health.note().startswith("STATE NOT PERSISTED since ")  # type: ignore[union-attr]
    assert health.note().endswith(": No space left on device (/state/consumers/x/records.journal.0)")  # type: ignore[union-attr]
    wall.now += 30
    assert health.seconds_since_success() == 30
    health.succeeded()
    assert health.persisted and health.retry_in() == 0 and health.note() is None
    assert health.seconds_since_success() == 0
    assert health.write_errors == 8  # a counter: it never goes back


def test_status_exit_code_and_line_while_not_persisted() -> None:
    health = PersistHealth("x")
    ok = {"ready": True, "consumers": {"x": {"state": health.status()}}}
    assert status_exit_code(ok) == 0
    health.failed(enospc())
    doc = {"ready": True, "consumers": {"x": {"plugin": "p", "state": health.status()}}}
    assert status_exit_code(doc) == 3
    text = format_status(doc)
    assert "STATE NOT PERSISTED since " in text and "No space left on device" in text


def _store_with_snapshot(tmp_path: Path) -> Path:
    d = tmp_path / "consumers" / "x"
    store = RecordStore(d)
    store.load()
    for i in range(3):
        store.put(f"/r/f{i}", PathRecord(Fingerprint(i, 1, 1, 1)))
    store.flush()
    store.compact()
    store.put("/r/f3", PathRecord(Fingerprint(3, 1, 1, 1)))
    store.flush()
    return d


@pytest.mark.parametrize("damage", ["garbage", "truncated", "zero-length", "wrong version"])
def test_unreadable_snapshot_is_set_aside_and_every_file_handed_over_again(tmp_path: Path, damage: str,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    d = _store_with_snapshot(tmp_path)
    snap = d / "records.json"
    data = snap.read_bytes()
    snap.write_bytes({"garbage": b"\x00{junk\n", "truncated": data[: len(data) // 2], "zero-length": b"",
                      "wrong version": json.dumps({"version": 99}).encode()}[damage])
    store = RecordStore(d)
    with caplog.at_level(logging.WARNING, logger="reloadd.state"):
        store.load()
    assert len(store) == 0  # every file is handed over again once
    aside = sorted(p.name for p in d.glob("*.broken-*"))
    assert [n.split(".broken-")[0] for n in aside] == ["records.journal.1", "records.json"]
    assert len(store.health.set_aside) == 2
    said = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(said) == 2 and "moved aside to" in said[0] and "handed over again once" in said[0]
    store.put("/r/f0", PathRecord(Fingerprint(0, 1, 1, 1)))
    store.flush()
    reread = RecordStore(d)
    reread.load()
    assert list(reread.by_str) == ["/r/f0"] and reread.health.set_aside == []


def test_damaged_journal_lines_are_set_aside_and_snapshotted_at_the_next_flush(tmp_path: Path) -> None:
    d = _store_with_snapshot(tmp_path)
    journal = d / "records.journal.1"
    journal.write_bytes(journal.read_bytes() + b"not json at all\n")
    store = RecordStore(d)
    store.load()
    assert len(store) == 4  # the good lines were read
    assert [p.name.split(".broken-")[0] for p in d.glob("*.broken-*")] == ["records.journal.1"]
    assert store.compaction_due
    store.flush()
    assert not (d / "records.journal.1").exists() and json.loads((d / "records.json").read_text())["gen"] == 2


def test_a_journal_newer_than_its_snapshot_is_set_aside(tmp_path: Path) -> None:
    d = _store_with_snapshot(tmp_path)
    (d / "records.json").unlink()
    store = RecordStore(d)
    store.load()
    assert len(store) == 0
    assert [p.name.split(".broken-")[0] for p in d.glob("*.broken-*")] == ["records.journal.1"]


@pytest.mark.parametrize("content", [b"\x00garbage", b'{"version": 1, "held": {"/r/a": [1]}}', b""])
def test_unreadable_prune_state_holds_every_removal_until_confirmed(tmp_path: Path, content: bytes) -> None:
    root = tmp_path / "r"
    root.mkdir()
    (root / "a").write_text("a")
    (root / "b").write_text("b")
    d = tmp_path / "state"
    d.mkdir()
    (d / "prune.json").write_bytes(content)
    records = {str(root / "a"): object(), str(root / "b"): object()}
    health = PersistHealth("x")
    guard = PruneGuard(PathFilter(roots=(root,)), records, lambda k: True, d, health=health)
    guard.load()
    assert len(health.set_aside) == 1 and list(d.glob("prune.json.broken-*"))
    (root / "a").unlink()  # an ordinary delete: a file is left, the root looks fine
    held = guard.check([str(root / "a")])
    assert "unreadable" in held[str(root / "a")] and "held until confirmed" in held[str(root / "a")]
    assert guard.removal_held(root / "a") is not None
    snapshot = guard.prepare()
    assert snapshot is not None
    guard.write(snapshot)  # the distrust survives a restart
    again = PruneGuard(PathFilter(roots=(root,)), records, lambda k: True, d)
    again.load()
    assert again.check([str(root / "a")])
    again.confirm()
    assert again.distrust is None and again.check([str(root / "a")]) == {}


def test_reloadd_plan_reads_without_setting_aside(tmp_path: Path) -> None:
    d = tmp_path / "state"
    d.mkdir()
    (d / "prune.json").write_bytes(b"junk")
    guard = PruneGuard(PathFilter(roots=()), {}, lambda k: True, d)
    with pytest.raises(StateError, match="corrupt prune state"):
        guard.load(read_only=True)
    assert (d / "prune.json").exists()


def test_a_flapping_disk_still_logs_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    mono = Clock()
    health = PersistHealth("x", monotonic=mono)
    with caplog.at_level(logging.WARNING, logger="reloadd.state"):
        for _ in range(1000):  # a nearly full disk: one write in two goes through
            health.failed(enospc())
            health.succeeded()
            mono.now += 0.05
    failed = [r for r in caplog.records if "Failed to persist" in r.getMessage()]
    recovered = [r for r in caplog.records if "persisted again" in r.getMessage()]
    assert len(failed) == 1 and len(recovered) == 1


def test_a_file_set_aside_is_shown_until_the_next_successful_write(tmp_path: Path) -> None:
    d = tmp_path / "state"
    d.mkdir()
    (d / "prune.json").write_bytes(b"junk")
    health = PersistHealth("x")
    PruneGuard(PathFilter(roots=()), {}, lambda k: True, d, health=health).load()
    doc = {"ready": True, "consumers": {"x": {"plugin": "p", "state": health.status()}}}
    text = format_status(doc)
    assert f"SET ASIDE: {d / 'prune.json'} (corrupt prune state" in text and "moved aside to" in text
    assert "every removal is held until confirmed" in text
    assert status_exit_code(doc) == 0  # persisted: only shown, the held removals say the rest
    health.succeeded()
    assert health.status()["set_aside"] == [] and health.set_aside_total == 1
