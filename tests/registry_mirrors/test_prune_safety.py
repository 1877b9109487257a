"""Prune safety (#21): a lost registries.conf.d keeps every hosts.toml it wrote, byte for byte, until confirmed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.waiting import until

from .conftest import mirror_conf
from .harness import running_reloader

pytestmark = pytest.mark.timeout(90)

HOSTS = ("one.example.com", "two.example.com")


def _files(hosts: Path) -> dict[str, tuple[bytes, int]]:
    return {h: ((hosts / h / "hosts.toml").read_bytes(), (hosts / h / "hosts.toml").stat().st_mtime_ns)
            for h in HOSTS if (hosts / h / "hosts.toml").exists()}


async def test_a_lost_drop_in_folder_keeps_every_hosts_toml_until_confirmed(tmp_path: Path) -> None:
    async with running_reloader(tmp_path, settings={"rescan_interval": "200ms"}) as run:
        for i, host in enumerate(HOSTS):
            (run.conf_d / f"{i}0-{host}.conf").write_text(mirror_conf(host, f"127.0.0.1:50{i}1"))
        await run.wait_for(lambda: len(_files(run.hosts)) == 2)
        await run.reloader.wait_idle(15)
        before = _files(run.hosts)
        written = run.consumer.stats["files_written"]
        r = run.reloader

        run.conf_d.rename(tmp_path / "away")
        await until(lambda: len(r.status()["consumers"]["mirrors"]["prune_held"]) == 2, what="held")
        start = r.engine.stats.rescans
        await until(lambda: r.engine.stats.rescans >= start + 5, what="5 rescans")
        await run.settle()  # registries.conf changes: the consumer re-reads everything and keeps the held hosts
        assert _files(run.hosts) == before
        status = r.status()["consumers"]["mirrors"]
        assert status["prune_held_unit"] == "hosts.toml files"
        assert sum(h["size"] for h in status["prune_held"]) == 2

        (tmp_path / "away").rename(run.conf_d)
        await until(lambda: not r.status()["consumers"]["mirrors"]["prune_held"], what="released")
        await run.settle()
        assert _files(run.hosts) == before, "the folder came back: no hosts.toml rewritten"
        assert run.consumer.stats["files_written"] == written

        for f in run.conf_d.iterdir():
            f.unlink()  # rm -rf registries.conf.d/*
        await until(lambda: len(r.status()["consumers"]["mirrors"]["prune_held"]) == 2, what="held again")
        await run.settle()
        assert _files(run.hosts) == before
        assert await r.confirm_prune() == 2
        await r.wait_idle(15)
        assert _files(run.hosts) == {}, "confirmed: the held removals ran"
