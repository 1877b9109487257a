"""Every common way of saving a file yields exactly one batch with the final fingerprint.

Real tools on real inotify: vim (both backupcopy settings), nano (in a pty), sed -i, cp,
mv in and out, write-to-temp-then-rename, shell truncate-and-write, rsync, a ConfigMap
``..data`` swap; and none at all for touch and chmod.
"""

from __future__ import annotations

import asyncio
import os
import pty
import shutil
import time
from pathlib import Path

import pytest

from reloadd import ChangeKind, Fingerprint

pytestmark = pytest.mark.timeout(60)


def fp_of(path: Path) -> Fingerprint:
    return Fingerprint.from_stat(os.stat(path))


async def settle_with_sentinel(rec, root: Path) -> None:
    """Write a sentinel after the change and wait for it: anything pending before it has settled."""
    sentinel = root / f"sentinel-{time.monotonic_ns()}"
    sentinel.write_text("s")
    await rec.wait_path(sentinel)


@pytest.fixture
async def watched(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    target = root / "app.conf"
    target.write_text("original line\n")
    rec = recorder_cls([root])
    r = await start_reloader(rec)
    await rec.wait_path(target)  # the start-up pass
    rec.batches.clear()
    return r, rec, root, target


async def run(*argv: str, **kw) -> None:
    proc = await asyncio.create_subprocess_exec(*argv, **kw)
    assert await proc.wait() == 0, argv


async def assert_one_save(rec, root: Path, target: Path, kind=ChangeKind.MODIFIED) -> None:
    await rec.wait_path(target)
    await settle_with_sentinel(rec, root)
    changes = rec.changes_for(target)
    assert len(changes) == 1, changes
    assert changes[0].kind is kind
    if kind is not ChangeKind.DELETED:
        assert changes[0].fingerprint == fp_of(target)
    others = [c.path for c in rec.changes if c.path != target and not c.path.name.startswith("sentinel-")]
    assert others == [], f"editor droppings leaked: {others}"


@pytest.mark.parametrize("backupcopy", ["yes", "no"])
async def test_vim_save(watched, backupcopy):
    _, rec, root, target = watched
    vim = shutil.which("vim") or shutil.which("vim.tiny")
    assert vim, "vim is installed by scripts/infra/install-deps.sh"
    await run(vim, "-u", "NONE", "-N", "-Es", "-c", f"set backupcopy={backupcopy} writebackup swapfile",
              "-c", "%s/original/edited/", "-c", "wq", str(target), cwd=root)
    assert "edited" in target.read_text()
    await assert_one_save(rec, root, target)


async def test_nano_save(watched):
    _, rec, root, target = watched
    nano = shutil.which("nano")
    assert nano, "nano is installed by scripts/infra/install-deps.sh"
    pid, fd = pty.fork()
    if pid == 0:  # child: a terminal editor on a pseudo-terminal
        os.environ["TERM"] = "xterm"
        os.execv(nano, [nano, "--ignorercfiles", str(target)])
    try:
        await asyncio.sleep(0.5)
        for keys in (b"edited ", b"\x0f", b"\r", b"\x18"):  # type, ^O, Enter, ^X
            os.write(fd, keys)
            await asyncio.sleep(0.3)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            try:
                os.read(fd, 65536)
            except OSError:
                pass
            await asyncio.sleep(0.05)
        else:
            os.kill(pid, 9)
            pytest.fail("nano did not exit")
    finally:
        os.close(fd)
    assert target.read_text().startswith("edited ")
    await assert_one_save(rec, root, target)


async def test_sed_in_place(watched):
    _, rec, root, target = watched
    await run("sed", "-i", "s/original/edited/", str(target))
    await assert_one_save(rec, root, target)


async def test_cp_over(watched, tmp_path):
    _, rec, root, target = watched
    src = tmp_path / "src.conf"
    src.write_text("copied content\n")
    await run("cp", str(src), str(target))
    await assert_one_save(rec, root, target)


async def test_rsync_over(watched, tmp_path):
    _, rec, root, target = watched
    src = tmp_path / "src.conf"
    src.write_text("rsynced content, longer\n")
    await run("rsync", str(src), str(target))
    await assert_one_save(rec, root, target)


async def test_mv_in(watched, tmp_path):
    _, rec, root, _ = watched
    src = tmp_path / "new.conf"
    src.write_text("moved in\n")
    dest = root / "new.conf"
    await run("mv", str(src), str(dest))
    await assert_one_save(rec, root, dest, kind=ChangeKind.ADDED)


async def test_mv_out(watched, tmp_path):
    _, rec, root, target = watched
    await run("mv", str(target), str(tmp_path / "gone.conf"))
    await assert_one_save(rec, root, target, kind=ChangeKind.DELETED)


async def test_write_temp_then_rename(watched):
    _, rec, root, target = watched
    tmp = root / ".app.conf.tmp"
    tmp.write_text("atomically replaced\n")
    os.replace(tmp, target)
    await assert_one_save(rec, root, target)


async def test_shell_truncate_and_write(watched):
    _, rec, root, target = watched
    await run("sh", "-c", f"printf 'rewritten by the shell\\n' > '{target}'")
    await assert_one_save(rec, root, target)


@pytest.mark.parametrize("action", ["touch", "chmod"])
async def test_touch_and_chmod_are_not_changes(watched, action):
    _, rec, root, target = watched
    if action == "touch":
        await run("touch", str(target))
    else:
        await run("chmod", "0600", str(target))
    await settle_with_sentinel(rec, root)
    assert rec.changes_for(target) == []


async def test_configmap_data_swap(tmp_path, recorder_cls, start_reloader):
    mount = tmp_path / "configmap"
    mount.mkdir()
    first = mount / "..2026_11_30_00_00_00.000000001"
    first.mkdir()
    (first / "app.yaml").write_text("version: 1\n")
    (first / "other.yaml").write_text("unchanged: true\n")
    os.symlink(first.name, mount / "..data")
    for key in ("app.yaml", "other.yaml"):
        os.symlink(f"..data/{key}", mount / key)
    rec = recorder_cls([mount])
    await start_reloader(rec)
    await rec.wait_for(lambda r: {c.path.name for c in r.changes} == {"app.yaml", "other.yaml"})
    assert all(".." not in c.path.name for c in rec.changes)
    rec.batches.clear()

    # kubelet's atomic writer: new timestamped dir, ..data_tmp symlink, rename over ..data, drop the old dir
    second = mount / "..2026_11_30_00_01_00.000000002"
    second.mkdir()
    (second / "app.yaml").write_text("version: 2\n")
    (second / "other.yaml").write_text("unchanged: true\n")
    os.symlink(second.name, mount / "..data_tmp")
    os.rename(mount / "..data_tmp", mount / "..data")
    shutil.rmtree(first)

    app = mount / "app.yaml"
    await rec.wait_path(app)
    await settle_with_sentinel(rec, mount)
    assert [c.kind for c in rec.changes_for(app)] == [ChangeKind.MODIFIED]
    assert rec.changes_for(app)[0].fingerprint == fp_of(app)
    assert rec.changes_for(mount / "other.yaml") == []  # same content behind a new inode: not a change
