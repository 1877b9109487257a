"""Prune safety (#21): a root that looks lost holds its removals; a person or the input coming back ends the hold.

The consumer here is an embedded recorder: the rule is the engine's, the same for every plugin (each plugin's
own tests check what it keeps on the real component it drives).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reloadd import ChangeKind
from reloadd._ops._terminal import format_status
from tests.daemon_config import hook_daemon_config
from tests.faults._daemon import Daemon
from tests.waiting import until

pytestmark = pytest.mark.timeout(120)

RESCANS = 5  # periodic rescans to sit through before saying "nothing was removed"


def deleted(rec, path: Path) -> list:
    return [c for c in rec.changes_for(path) if c.kind is ChangeKind.DELETED]


async def quiet_rescans(r, n: int = RESCANS) -> None:
    """Let ``n`` periodic rescans pass: each would find the missing files again and hand them over."""
    start = r.engine.stats.rescans
    await until(lambda: r.engine.stats.rescans >= start + n, what=f"{n} rescans")


def held_paths(r, name: str = "rec") -> set[str]:
    return {h["path"] for h in r.status()["consumers"][name]["prune_held"]}


def fill(root: Path, n: int = 3) -> list[Path]:
    root.mkdir(exist_ok=True)
    files = [root / f"f{i}.conf" for i in range(n)]
    for i, f in enumerate(files):
        f.write_text(f"content {i}")
    return files


async def test_a_root_moved_away_holds_every_removal_and_coming_back_recreates_nothing(
        tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    files = fill(root)
    rec = recorder_cls([root])
    r = await start_reloader(rec, rescan_interval="200ms")
    before = len(rec.changes)
    root.rename(tmp_path / "elsewhere")  # what an unmounted volume looks like
    await until(lambda: held_paths(r) == {str(f) for f in files}, what="the removals held")
    await quiet_rescans(r)
    assert all(not deleted(rec, f) for f in files)
    status = r.status()["consumers"]["rec"]
    assert status["prune_held"][0]["why"] == f"root {root} disappeared"
    text = format_status({"consumers": {"rec": status}})
    assert "PRUNE HELD: 3 files of 3 path(s)" in text and "--confirm-prune" in text
    assert r.ready, "a hold keeps the node on its last good state: still ready"

    (tmp_path / "elsewhere").rename(root)
    await until(lambda: not held_paths(r), what="the hold released")
    await r.wait_idle(10)
    assert len(rec.changes) == before, "the root came back unchanged: nothing is handed over again"


async def test_an_emptied_root_is_held_and_confirm_runs_exactly_the_held_removals(
        tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    files = fill(root)
    keep = tmp_path / "other"
    other = fill(keep, 2)
    rec = recorder_cls([root, keep])
    r = await start_reloader(rec, rescan_interval="200ms")
    for f in files:
        f.unlink()  # rm -rf root/*
    await until(lambda: held_paths(r) == {str(f) for f in files}, what="the removals held")
    await quiet_rescans(r)
    assert all(not deleted(rec, f) for f in files)
    assert "every file under root" in r.status()["consumers"]["rec"]["prune_held"][0]["why"]

    assert await r.confirm_prune() == 3
    await until(lambda: all(deleted(rec, f) for f in files), what="the confirmed removals")
    await r.wait_idle(10)
    assert all(c.prune_confirmed for f in files for c in deleted(rec, f))
    assert all(not deleted(rec, f) for f in other)
    assert not held_paths(r) and not any(str(f) in rec.ctx.records for f in files)

    # A confirmation covers the removals it ran, not the next loss of the same files.
    fill(root)
    await until(lambda: all(str(f) in rec.ctx.records for f in files), what="the files back")
    for f in files:
        f.unlink()
    await until(lambda: held_paths(r) == {str(f) for f in files}, what="the new removals held")
    await quiet_rescans(r)
    assert all(len(deleted(rec, f)) == 1 for f in files)


async def test_an_ordinary_delete_of_one_file_is_handed_over_at_once(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    files = fill(root)
    rec = recorder_cls([root])
    r = await start_reloader(rec)
    files[0].unlink()
    await until(lambda: bool(deleted(rec, files[0])), what="the delete")
    assert not held_paths(r)
    assert not deleted(rec, files[0])[0].prune_confirmed


async def test_a_replaced_root_holds_the_old_files_and_takes_the_new_ones(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    files = fill(root)
    rec = recorder_cls([root])
    r = await start_reloader(rec, rescan_interval="200ms")
    root.rename(tmp_path / "old")
    root.mkdir()
    (root / "new.conf").write_text("new")
    await rec.wait_path(root / "new.conf")
    await until(lambda: held_paths(r) == {str(f) for f in files}, what="the removals held")
    await quiet_rescans(r)
    assert all(not deleted(rec, f) for f in files)
    whys = {h["why"] for h in r.status()["consumers"]["rec"]["prune_held"]}
    assert whys <= {f"root {root} disappeared", f"root {root} was replaced by another directory"}, whys


async def test_a_hold_survives_a_restart_with_the_root_still_gone(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    files = fill(root)
    rec = recorder_cls([root])
    r = await start_reloader(rec)
    shutil.rmtree(root)
    await until(lambda: len(held_paths(r)) == 3, what="the removals held")
    since = {h["path"]: h["since"] for h in r.status()["consumers"]["rec"]["prune_held"]}
    await r.close()

    again = recorder_cls([root])
    r2 = await start_reloader(again, rescan_interval="200ms")
    await quiet_rescans(r2)
    assert {h["path"]: h["since"] for h in r2.status()["consumers"]["rec"]["prune_held"]} == since
    assert all(not deleted(again, f) for f in files)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (CI runs as root)")
async def test_an_unmounted_volume_holds_its_removals_and_remounting_releases_them(
        tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "mnt"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(root)], check=True)
    try:
        files = fill(root)
        rec = recorder_cls([root])
        r = await start_reloader(rec, rescan_interval="200ms")
        stash = tmp_path / "stash"
        shutil.copytree(root, stash, copy_function=shutil.copy2)
        subprocess.run(["umount", str(root)], check=True)  # the mount point stays, empty
        await until(lambda: held_paths(r) == {str(f) for f in files}, what="the removals held")
        await quiet_rescans(r)
        assert all(not deleted(rec, f) for f in files)
        before = len(rec.changes)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(root)], check=True)
        for f in stash.iterdir():  # the same files come back (restored: new inodes, same content)
            shutil.copy2(f, root / f.name)
        await until(lambda: not held_paths(r), what="the hold released")
        await r.wait_idle(10)
        assert len(rec.changes) == before, "same content back: nothing handed over again"
    finally:
        subprocess.run(["umount", str(root)], check=False)


HOOK = """\
import json, os, sys
batch = json.load(sys.stdin)
with open(os.environ["HOOK_LOG"], "a") as log:
    for c in batch["changes"]:
        log.write(c["kind"] + " " + c["path"] + "\\n")
"""


def _daemon_config(tmp_path: Path, root: Path, sock: Path) -> Path:
    return hook_daemon_config(tmp_path, root, hook=HOOK, control_socket=sock, rescan_interval="300ms")


def _hook_log(tmp_path: Path) -> list[str]:
    log = tmp_path / "hook.log"
    return log.read_text().splitlines() if log.exists() else []


def _held(daemon: Daemon) -> list[dict]:
    doc = daemon.status()
    return doc["consumers"]["hook"]["prune_held"] if doc else []


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping CAP_DAC_OVERRIDE to get a real EACCES needs root")
async def test_an_unreadable_root_holds_across_kill9_and_the_cli_confirm_runs_the_removals(tmp_path):
    """The daemon runs without the capabilities that let root read anything, so chmod 000 is a real EACCES."""
    root = tmp_path / "root"
    files = fill(root)
    sock = tmp_path / "ctl.sock"
    cfg = _daemon_config(tmp_path, root, sock)
    drop = "-dac_override,-dac_read_search"
    daemon = Daemon(cfg, tmp_path / "daemon.log", env={"HOOK_LOG": str(tmp_path / "hook.log")},
                    control_socket=sock, prefix=("setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}"))
    await daemon.start()
    try:
        await until(lambda: len(_hook_log(tmp_path)) == 3 and daemon.idle(), what="the first pass")
        root.chmod(0)
        await until(lambda: len(_held(daemon)) == 3, what="the removals held")
        assert "is unreadable: Permission denied" in _held(daemon)[0]["why"]
        await daemon.kill9()
        await daemon.start()  # still unreadable after the restart
        await until(lambda: daemon.status() is not None and daemon.status()["ready"], what="the restart")
        await until(lambda: len(_held(daemon)) == 3, what="the hold after kill -9")
        assert not [line for line in _hook_log(tmp_path) if line.startswith("deleted")]

        out = subprocess.run([sys.executable, "-m", "reloadd", "reload", "--confirm-prune", "--config", str(cfg)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert "running 3 held removal(s)" in out.stdout
        await until(lambda: len([x for x in _hook_log(tmp_path) if x.startswith("deleted")]) == 3,
                    what="the confirmed removals")
        assert sorted(x.split(" ", 1)[1] for x in _hook_log(tmp_path) if x.startswith("deleted")) == \
            sorted(str(f) for f in files)
        await until(lambda: not _held(daemon) and daemon.idle(), what="nothing held")
    finally:
        root.chmod(0o755)
        await daemon.stop()


async def test_confirm_prune_without_a_control_socket_says_so(tmp_path):
    cfg = tmp_path / "reloadd.toml"
    cfg.write_text('[reloadd]\nstate_dir = ""\n')
    out = subprocess.run([sys.executable, "-m", "reloadd", "reload", "--confirm-prune", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "control_socket" in out.stderr


def test_an_emptied_root_still_counts_recorded_files_the_consumer_no_longer_takes(tmp_path):
    """Files left that the filter no longer takes (renamed ``.skip``, say) make the deletion an edit, not a loss;
    the guard sees them from the listing it made, also in a sub-directory, and probes only unlisted places."""
    from reloadd._filters import PathFilter
    from reloadd._pipeline._prune import PruneGuard

    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    names = [root / "a.conf", root / "sub" / "b.conf", root / "sub" / "c.conf"]
    records = {str(p): b"" for p in names}
    guard = PruneGuard(PathFilter((root,)), records, owned=lambda key: False, directory=None)
    names[1].write_text("left, not taken")
    assert guard.verdict(str(root)) is None
    names[1].unlink()
    assert guard.verdict(str(root)) == f"every file under root {root} went at once"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "d.conf").write_text("reached through a link the walk does not follow")
    (root / "link").symlink_to(elsewhere)
    records[str(root / "link" / "d.conf")] = b""  # in a directory the walk did not list: probed
    assert guard.verdict(str(root)) is None


def test_a_held_removal_whose_record_is_gone_is_not_loaded_again(tmp_path):
    """A crash after a hold ended (its record's removal durable) but before ``prune.json`` was rewritten."""
    from reloadd._filters import PathFilter
    from reloadd._pipeline._prune import PruneGuard

    root = tmp_path / "root"
    root.mkdir()
    records = {str(root / "a"): b"", str(root / "b"): b""}
    guard = PruneGuard(PathFilter((root,)), records, owned=lambda key: True, directory=tmp_path)
    for key in records:
        guard.hold(key, "root gone")
    guard.write(guard.prepare())
    del records[str(root / "b")]
    again = PruneGuard(PathFilter((root,)), records, owned=lambda key: True, directory=tmp_path)
    again.load()
    assert set(again.held) == {str(root / "a")}
    assert again.dirty  # written without it at the next flush


def test_a_guard_asked_again_answers_as_a_listing_would_without_listing(tmp_path, monkeypatch):
    """A burst of deletions asks the guard once per settling step: while the file it found last time is still
    there, it is not listed again; whatever happened to that file, the answer is a full listing's."""
    from reloadd._filters import PathFilter
    from reloadd._pipeline import _prune
    from reloadd._pipeline._prune import PruneGuard

    listings: list[str] = []
    real_scandir = os.scandir

    def counting(path):
        if not isinstance(path, int):
            listings.append(os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(_prune.os, "scandir", counting)

    def scene(name: str) -> tuple[Path, PruneGuard, PruneGuard]:
        root = tmp_path / name / "root"
        (root / "a").mkdir(parents=True)
        (root / "b").mkdir()
        (root / "b" / "new.conf").write_text("not recorded yet")
        records = {str(root / "a" / f"f{i}.conf"): b"" for i in range(3)}

        def guard() -> PruneGuard:
            return PruneGuard(PathFilter((root,), recursive=True), records, owned=lambda k: k.endswith(".conf"),
                              directory=None)

        asked = guard()
        assert asked.verdict(str(root)) is None  # the one file there: what it found
        for key in records:
            Path(key).write_text("x")
        return root, asked, guard()  # the second never asked before: it lists

    root, asked, _ = scene("kept")
    listings.clear()
    assert asked.verdict(str(root)) is None
    assert listings == [str(root)]  # the root's readability only: nothing listed below it

    lost = "every file under root {root} went at once"
    # The file it found made a directory, its directory swapped for a symlink (a listing does not follow one)
    # to a directory holding the same name, or gone with every other file: lost, as a listing finds.
    for how in ("a directory", "behind a symlink", "gone"):
        root, asked, fresh = scene(how.replace(" ", "-"))
        for key in (root / "a").iterdir():
            key.unlink()
        if how == "a directory":
            (root / "b" / "new.conf").unlink()
            (root / "b" / "new.conf").mkdir()
        elif how == "behind a symlink":
            shutil.rmtree(root / "b")
            (root.parent / "elsewhere").mkdir()
            (root.parent / "elsewhere" / "new.conf").write_text("x")
            (root / "b").symlink_to(root.parent / "elsewhere")
        else:
            (root / "b" / "new.conf").unlink()
        assert fresh.verdict(str(root)) == lost.format(root=root), how
        assert asked.verdict(str(root)) == lost.format(root=root), how
