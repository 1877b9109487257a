"""Through the real engine (real inotify): editor saves, moves and folder recreation reload once.

The consumer is loaded from its entry point like any third-party plugin; its ``handle`` is
wrapped only to count the batches it receives.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.waiting import until

from .conftest import mirror_conf
from .harness import HOST, running_reloader, sh

pytestmark = pytest.mark.timeout(90)


def _temp_rename(target: Path, text: str) -> None:
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, target)


def _truncate_write(target: Path, text: str) -> None:
    target.write_text(text)


SAVES = ["vim", "sed-i", "temp-rename", "truncate-write"]


@pytest.mark.parametrize("how", SAVES)
async def test_editor_save_reloads_exactly_once(tmp_path: Path, how: str) -> None:
    async with running_reloader(tmp_path) as run:
        drop = run.conf_d / "50-mirror.conf"
        drop.write_text(mirror_conf(HOST, "127.0.0.1:5001"))
        await run.wait_path(drop)
        assert run.mirrors() == ["http://127.0.0.1:5001"]
        run.batches.clear()
        written = run.consumer.stats["files_written"]

        if how == "vim":
            await sh("vim", "-u", "NONE", "-N", "-Es", "-c", "%s/5001/5002/", "-c", "wq", str(drop), cwd=run.conf_d)
        elif how == "sed-i":
            await sh("sed", "-i", "s/5001/5002/", str(drop))
        elif how == "temp-rename":
            _temp_rename(drop, mirror_conf(HOST, "127.0.0.1:5002"))
        else:
            _truncate_write(drop, mirror_conf(HOST, "127.0.0.1:5002"))
        await run.wait_path(drop)
        await run.settle()
        assert len(run.batches_for(drop)) == 1
        assert run.mirrors() == ["http://127.0.0.1:5002"]
        assert run.consumer.stats["files_written"] == written + 1
        leaked = [p for b in run.batches for p in b.paths if p not in (drop, run.main)]
        assert leaked == []


@pytest.mark.parametrize("dest", ["outside", "renamed-off"])
async def test_moving_a_drop_in_out_removes_its_mirror_once(tmp_path: Path, dest: str) -> None:
    async with running_reloader(tmp_path) as run:
        drop = run.conf_d / "50-mirror.conf"
        drop.write_text(mirror_conf(HOST, "127.0.0.1:5001"))
        await run.wait_path(drop)
        run.batches.clear()
        target = tmp_path / "parked.conf" if dest == "outside" else drop.with_suffix(".conf.off")
        await sh("mv", str(drop), str(target))
        await run.wait_path(drop)
        await run.settle()
        assert len(run.batches_for(drop)) == 1
        assert run.mirrors() is None
        assert not (run.hosts / HOST).exists()


async def test_deleting_the_folder_holds_its_mirrors_and_recreating_it_reloads_once(tmp_path: Path) -> None:
    async with running_reloader(tmp_path) as run:
        drop = run.conf_d / "50-mirror.conf"
        drop.write_text(mirror_conf(HOST, "127.0.0.1:5001"))
        await run.wait_path(drop)
        run.batches.clear()

        shutil.rmtree(run.conf_d)  # a vanished registries.conf.d: its removal is held (prune safety, #21)
        await until(lambda: bool(run.reloader.status()["consumers"]["mirrors"]["prune_held"]), what="held")
        await run.settle()  # another input changes: everything is re-read, the held host stays
        assert run.batches_for(drop) == []
        assert run.mirrors() == ["http://127.0.0.1:5001"]

        run.conf_d.mkdir()
        drop.write_text(mirror_conf(HOST, "127.0.0.1:5003"))
        await run.wait_path(drop)
        await run.settle()
        assert len(run.batches_for(drop)) == 1
        assert run.mirrors() == ["http://127.0.0.1:5003"]
        assert not run.reloader.status()["consumers"]["mirrors"]["prune_held"]


async def test_broken_drop_in_is_recorded_and_last_good_kept(tmp_path: Path) -> None:
    async with running_reloader(tmp_path) as run:
        drop = run.conf_d / "50-mirror.conf"
        drop.write_text(mirror_conf(HOST, "127.0.0.1:5001"))
        await run.wait_path(drop)
        drop.write_text(mirror_conf(HOST, "127.0.0.1:5002").replace('location = "127', "location = 127"))
        await run.wait_path(drop, 2)
        await run.reloader.wait_idle(15)
        record = run.reloader.engine.slots["mirrors"].records[drop]
        assert record.error is not None and record.error.startswith(f"{drop}: invalid TOML")
        rejected = run.reloader.status()["consumers"]["mirrors"]["rejected"]
        assert rejected == [{"path": str(drop), "error": record.error}]  # what `reloadd status` shows
        assert run.mirrors() == ["http://127.0.0.1:5001"]
        assert run.consumer.stats["config_valid"] == 0
