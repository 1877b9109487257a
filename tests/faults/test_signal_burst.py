"""1,000 SIGHUPs in a burst to a `reloadd run` subprocess: a bounded number of full resyncs, nothing lost.

The exec consumer's hook logs every batch with its reason. Each SIGHUP asks for a forced pass
over every path; the burst must collapse (the kernel merges pending signals, the engine merges
queued resyncs) into a handful of passes, and the daemon must keep serving afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from tests.daemon_config import hook_daemon_config
from tests.reliability import Reliability
from tests.waiting import until

from ._daemon import Daemon

pytestmark = pytest.mark.timeout(120)

FILES = 20
SIGNALS = 1000
MAX_RESYNCS = 10  # however many SIGHUPs arrive while a resync is queued, it is one more pass

HOOK = textwrap.dedent(
    """
    import json, os, sys
    batch = json.load(sys.stdin)
    line = {"reason": batch["reason"], "paths": [os.path.basename(c["path"]) for c in batch["changes"]]}
    with open(os.environ["BURST_LOG"], "a") as f:
        f.write(json.dumps(line) + "\\n")
    """
)


def batches(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


async def test_sighup_burst(tmp_path: Path, reliability: Reliability) -> None:
    root = tmp_path / "root"
    root.mkdir()
    for i in range(FILES):
        (root / f"f{i:02d}.conf").write_text(str(i))
    log = tmp_path / "batches.jsonl"
    sock = tmp_path / "ctl.sock"
    cfg = hook_daemon_config(tmp_path, root, hook=HOOK, control_socket=sock)
    async with Daemon(cfg, tmp_path / "daemon.log", env={"BURST_LOG": str(log)}, control_socket=sock) as daemon:
        await until(lambda: daemon.idle() and sum(len(b["paths"]) for b in batches(log)) >= FILES, what="start-up pass")
        before = len(batches(log))
        t0 = time.monotonic()
        for _ in range(SIGNALS):
            os.kill(daemon.pid, signal.SIGHUP)
        burst_s = time.monotonic() - t0
        await until(lambda: any(b["reason"] == "signal" for b in batches(log)[before:]), what="a resync")
        await until(daemon.idle, what="idle after the burst")
        await asyncio.sleep(1.0)  # a resync still owed would have started by now (it is ≤ quiet away)
        await until(daemon.idle, what="idle after the burst")
        after = batches(log)[before:]
        resync_paths = [p for b in after if b["reason"] == "signal" for p in b["paths"]]  # type: ignore[union-attr]
        per_file = {f"f{i:02d}.conf": resync_paths.count(f"f{i:02d}.conf") for i in range(FILES)}
        resyncs = max(per_file.values())
        # Still serving: a new file after the burst is handed over.
        (root / "late.conf").write_text("after the burst")
        await until(lambda: any("late.conf" in b["paths"] for b in batches(log)), what="late.conf")  # type: ignore[operator]
        assert daemon.proc is not None and daemon.proc.returncode is None
        received = (tmp_path / "daemon.log").read_text().count("Received SIGHUP")
    assert min(per_file.values()) >= 1, per_file  # every file was resynced at least once
    assert resyncs <= MAX_RESYNCS, per_file
    reliability.record(
        f"{SIGNALS} SIGHUPs in a burst", trials=1, expected=FILES, delivered=sum(1 for n in per_file.values() if n),
        duplicates=sum(n - 1 for n in per_file.values() if n > 1), lost=sum(1 for n in per_file.values() if not n),
        notes=f"sent in {burst_s * 1000:.0f} ms; {received} handled by the daemon (the kernel merges pending "
              f"signals); {resyncs} full resync(s) of {FILES} files (bound {MAX_RESYNCS}); serving after",
    )
