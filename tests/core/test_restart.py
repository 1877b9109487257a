"""Kill -9 mid-batch and restart: unacknowledged paths come back, acknowledged ones do not."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

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
            time.sleep(120)
    """
)


async def wait_until(pred, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        if loop.time() > end:
            raise TimeoutError
        await asyncio.sleep(0.05)  # polling a file another process writes


def deliveries(d: Path) -> list[str]:
    log = d / "deliveries.log"
    return log.read_text().splitlines() if log.exists() else []


async def test_kill_9_during_batch_then_restart(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.conf").write_text("a")
    (root / "b.conf").write_text("b")
    (tmp_path / "hook.py").write_text(HOOK)
    cfg = tmp_path / "reloadd.toml"
    cfg.write_text(textwrap.dedent(f"""
        [reloadd]
        state_dir = "{tmp_path / 'state'}"
        quiet = "100ms"
        [[consumer]]
        name = "hook"
        plugin = "exec"
        paths = ["{root}"]
        [consumer.options]
        command = ["{sys.executable}", "{tmp_path / 'hook.py'}"]
    """))

    async def start() -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "reloadd", "run", "--config", str(cfg),
            start_new_session=True, stderr=asyncio.subprocess.DEVNULL,
        )

    daemon = await start()
    try:
        await wait_until(lambda: len(deliveries(tmp_path)) == 2)
        (root / "block.conf").write_text("takes forever")
        await wait_until(lambda: (tmp_path / "blocked").exists())
        os.killpg(daemon.pid, signal.SIGKILL)  # reloadd and the hook it runs
        await daemon.wait()
    finally:
        if daemon.returncode is None:
            os.killpg(daemon.pid, signal.SIGKILL)
    (tmp_path / "unblock").write_text("")
    daemon = await start()
    try:
        await wait_until(lambda: sum("block.conf" in line for line in deliveries(tmp_path)) == 2)
        (root / "c.conf").write_text("after restart")
        await wait_until(lambda: any("c.conf" in line for line in deliveries(tmp_path)))
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(daemon.wait(), 30) == 0
    lines = deliveries(tmp_path)
    assert sum("a.conf" in line for line in lines) == 1, lines
    assert sum("b.conf" in line for line in lines) == 1, lines
    assert "startup added block.conf" in lines, lines  # never acknowledged: handed over again
