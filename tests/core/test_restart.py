"""Kill -9 mid-batch and restart: unacknowledged paths come back, acknowledged ones do not."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from reloadd import ChangeKind, Reason, Reloader, parse_config
from tests.daemon_config import hook_daemon_config
from tests.waiting import until

pytestmark = pytest.mark.timeout(90)

HOOK = textwrap.dedent(
    """
    import json, os, sys, time
    batch = json.load(sys.stdin)
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "deliveries.log"), "a") as log:
        for c in batch["changes"]:
            log.write(f"{batch['reason']} {c['kind']} {os.path.basename(c['path'])}\\n")
    if any(c["path"].endswith("block.conf") for c in batch["changes"]):
        if not os.path.exists(os.path.join(here, "unblock")):
            open(os.path.join(here, "blocked"), "w").close()
            for _ in range(1200):  # until the test unblocks it (the hook outlives a kill -9 of reloadd)
                if os.path.exists(os.path.join(here, "unblock")):
                    break
                time.sleep(0.1)
    """
)


  # polling a file another process writes


def deliveries(d: Path) -> list[str]:
    log = d / "deliveries.log"
    return log.read_text().splitlines() if log.exists() else []


async def test_kill_9_during_batch_then_restart(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.conf").write_text("a")
    (root / "b.conf").write_text("b")
    cfg = hook_daemon_config(tmp_path, root, hook=HOOK)

    async def start() -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "reloadd", "run", "--config", str(cfg),
            start_new_session=True, stderr=asyncio.subprocess.DEVNULL,
        )

    daemon = await start()
    try:
        await until(lambda: len(deliveries(tmp_path)) == 2)
        (root / "block.conf").write_text("takes forever")
        await until(lambda: (tmp_path / "blocked").exists())
        os.killpg(daemon.pid, signal.SIGKILL)  # reloadd (its hook runs in a session of its own: unblocked below)
        await daemon.wait()
    finally:
        if daemon.returncode is None:
            os.killpg(daemon.pid, signal.SIGKILL)
    (tmp_path / "unblock").write_text("")
    daemon = await start()
    try:
        await until(lambda: sum("block.conf" in line for line in deliveries(tmp_path)) == 2)
        (root / "c.conf").write_text("after restart")
        await until(lambda: any("c.conf" in line for line in deliveries(tmp_path)))
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(daemon.wait(), 30) == 0
    lines = deliveries(tmp_path)
    assert sum("a.conf" in line for line in lines) == 1, lines
    assert sum("b.conf" in line for line in lines) == 1, lines
    assert "startup added block.conf" in lines, lines  # never acknowledged: handed over again


async def test_deletes_while_stopped_are_found_with_overlapping_roots(tmp_path, recorder_cls):
    """Paths removed while stopped are delivered as deletes at start, also when two consumers walk the same tree."""
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    names = [f"f{i}.conf" for i in range(10)]
    for n in names:
        (root / n).write_text(n)
        (root / "sub" / n).write_text(n)
    cfg = parse_config({"reloadd": {"state_dir": str(tmp_path / "state"), "quiet": "50ms"}})

    def consumers():
        deep = recorder_cls([root], name="deep")
        flat = recorder_cls([root], name="flat", recursive=False)  # the same top, walked twice
        return deep, flat

    deep, flat = consumers()
    async with Reloader(cfg, consumers=[deep, flat]) as r:
        await r.wait_idle(10)
    assert len(deep.changes) == 20 and len(flat.changes) == 10
    (root / "f3.conf").unlink()
    (root / "sub" / "f7.conf").unlink()
    deep, flat = consumers()
    async with Reloader(cfg, consumers=[deep, flat]) as r:
        await r.wait_idle(10)
        gone = {(c.path.relative_to(root).as_posix(), c.kind) for c in deep.changes}
        assert gone == {("f3.conf", ChangeKind.DELETED), ("sub/f7.conf", ChangeKind.DELETED)}
        assert {(c.path.name, c.kind) for c in flat.changes} == {("f3.conf", ChangeKind.DELETED)}
        # and a rescan with nothing gone observes nothing
        await r.engine.reconcile(None, Reason.RESCAN)
        await r.wait_idle(10)
        assert len(deep.changes) == 2 and len(flat.changes) == 1
