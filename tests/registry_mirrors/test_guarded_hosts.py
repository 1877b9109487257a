"""Guarded hosts.toml (#23): a hosts.toml reloadd wrote that is deleted or rewritten is put back, by itself.

Real inotify on the hosts directory through the ``hosts-guard`` source; no SIGHUP, no change to any input.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reloadd._pipeline._plan import plan
from tests.waiting import until

from .conftest import mirror_conf
from .harness import HOST, running_reloader

pytestmark = pytest.mark.timeout(90)

DRIFTS = ("hosts-guard", "drifted")


async def test_a_deleted_or_rewritten_hosts_toml_comes_back_and_our_own_writes_are_not_drift(tmp_path: Path) -> None:
    async with running_reloader(tmp_path) as run:
        drop = run.conf_d / "50-mirror.conf"
        drop.write_text(mirror_conf(HOST, "127.0.0.1:5001"))
        await run.wait_path(drop)
        await run.reloader.wait_idle(15)
        hosts_toml = run.hosts / HOST / "hosts.toml"
        good = hosts_toml.read_bytes()
        events = run.reloader.engine.stats.events
        assert events[DRIFTS] == 0

        hosts_toml.unlink()  # a clean-up script
        await until(lambda: hosts_toml.exists() and hosts_toml.read_bytes() == good,
                    timeout=2.0, what="the file put back within 2 s")
        assert events[DRIFTS] >= 1
        assert any(b.reason.value == "drift" for b in run.batches_for(drop))

        tmp = hosts_toml.with_name(".edit")
        tmp.write_text('server = "https://registry.example.com"\n')  # configuration management's own version
        os.replace(tmp, hosts_toml)
        await until(lambda: hosts_toml.read_bytes() == good, timeout=2.0, what="the rewrite undone within 2 s")
        await run.reloader.wait_idle(15)

        seen = events[DRIFTS]
        drop.write_text(mirror_conf(HOST, "127.0.0.1:5002"))  # an ordinary edit: reloadd rewrites the file itself
        await run.wait_path(drop, len(run.batches_for(drop)) + 1)
        await run.settle()
        assert run.mirrors() == ["http://127.0.0.1:5002"]
        assert events[DRIFTS] == seen, "reloadd's own write was taken for drift"

        foreign = run.hosts / "other.example.com"
        foreign.mkdir()
        (foreign / "hosts.toml").write_text('server = "https://other.example.com"\n')  # another tool's host
        (foreign / "hosts.toml").unlink()
        await run.settle()
        assert events[DRIFTS] == seen, "another tool's hosts.toml was taken for drift"


@pytest.mark.parametrize("mode", ["detect", "off"])
async def test_detect_lists_a_rewritten_hosts_toml_and_off_ignores_it(tmp_path: Path, mode: str) -> None:
    async with running_reloader(tmp_path, drift=mode) as run:
        drop = run.conf_d / "50-mirror.conf"
        drop.write_text(mirror_conf(HOST, "127.0.0.1:5001"))
        await run.wait_path(drop)
        await run.reloader.wait_idle(15)
        hosts_toml = run.hosts / HOST / "hosts.toml"
        theirs = b'server = "https://registry.example.com"\n'
        tmp = hosts_toml.with_name(".edit")
        tmp.write_bytes(theirs)
        os.replace(tmp, hosts_toml)

        def listed() -> bool:
            return bool(run.reloader.status()["consumers"]["mirrors"]["drift"])

        if mode == "detect":
            await until(listed, what="the rewrite listed as drift")
        await run.settle()
        assert hosts_toml.read_bytes() == theirs, f"drift = {mode} changed the file"
        entries = run.reloader.status()["consumers"]["mirrors"]["drift"]
        if mode == "off":
            assert entries == []
            return
        (entry,) = entries
        assert (entry["kind"], entry["what"], entry["restored"]) == ("file", str(hosts_toml), False), entry
        assert entry["path"] == str(drop) and "rewritten" in entry["why"], entry
        report = await plan(run.reloader.config)
        planned = [(p, c.action, c.target) for p, cs in report.consumers[0].changes.items() for c in cs]
        assert (drop, "drift", str(hosts_toml)) in planned and report.exit_code == 2, planned
