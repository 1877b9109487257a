"""The state disk fails under a running daemon: full, remounted read-only, EIO on write.

A real ``reloadd run`` (exec consumer) with its ``state_dir`` on a real file system that fails:

* a 1 MiB tmpfs filled to the last byte, then 2,000 files saved;
* a tmpfs remounted read-only while it runs;
* a FUSE passthrough (``_eiofs``) whose writes answer EIO on demand.

Each proves: every file reaches the consumer while the disk fails (nothing lost); ``reloadd status``
says ``STATE NOT PERSISTED since …: <cause> (<path>)`` and exits 3; the metrics count the failed writes;
``/readyz`` fails once it lasts longer than ``ready_max_age``; the log carries one line per cause per
minute, not one per batch (the rate is asserted); once the disk takes writes again the state is
persisted (a restart hands nothing over again), and a ``kill -9`` while it still failed hands over
again at most what was acknowledged meanwhile.
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_config import hook_daemon_config
from tests.faults._daemon import Daemon
from tests.faults._mounts import eio_fs, fill, remount, tmpfs
from tests.faults.test_exposure import free_port
from tests.reliability import Reliability
from tests.waiting import until

pytestmark = pytest.mark.timeout(300)

HOOK = textwrap.dedent(
    """
    import json, os, sys
    batch = json.load(sys.stdin)
    with open(os.environ["DELIVERED_LOG"], "a") as log:
        log.write("".join(os.path.basename(c["path"]) + "\\n" for c in batch["changes"] if c["kind"] != "deleted"))
    """
)

READY_MAX_AGE = 3.0
QUIET_WINDOW = 12.0  # seconds the disk stays failing after every file was delivered: the log-rate window
MINUTE_WINDOW = 70.0  # the full disk stays full past a minute: its second log line carries the count suppressed


class Bed:
    """One exec daemon whose state lives on ``state`` (a mount the test breaks), and what it delivered."""

    def __init__(self, tmp_path: Path, state: Path) -> None:
        self.root = tmp_path / "root"
        self.root.mkdir()
        self.delivered_log = tmp_path / "delivered.log"
        self.log = tmp_path / "daemon.log"
        self.port = free_port()
        self.cfg = hook_daemon_config(
            tmp_path, self.root, hook=HOOK, state_dir=state, control_socket=tmp_path / "ctl.sock",
            metrics_listen=f"127.0.0.1:{self.port}", ready_max_age=f"{READY_MAX_AGE:g}s")
        self.daemon = Daemon(self.cfg, self.log, env={"DELIVERED_LOG": str(self.delivered_log)},
                             control_socket=tmp_path / "ctl.sock")

    def delivered(self) -> Counter[str]:
        text = self.delivered_log.read_text() if self.delivered_log.exists() else ""
        return Counter(text.split())

    def save(self, names: list[str]) -> None:
        for name in names:
            (self.root / name).write_text(name)

    async def save_paced(self, names: list[str], per: int = 10, every: float = 0.05) -> None:
        """Save ``per`` files every ``every`` seconds: many small batches, each one a write of the state."""
        for i in range(0, len(names), per):
            self.save(names[i:i + per])
            await asyncio.sleep(every)

    async def all_delivered(self, names: list[str], timeout: float = 120) -> None:
        await until(lambda: all(self.delivered()[n] for n in names), what=f"{len(names)} files delivered",
                    timeout=timeout, every=0.2)

    def cli_status(self) -> tuple[int, str]:
        p = subprocess.run([sys.executable, "-m", "reloadd", "status", "--config", str(self.cfg)],
                           capture_output=True, text=True, timeout=30)
        return p.returncode, p.stdout + p.stderr

    def state(self) -> dict[str, Any]:
        doc = self.daemon.status()
        assert doc is not None
        return dict(doc["consumers"]["hook"]["state"])

    def metrics(self) -> dict[str, float]:
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5).read().decode()
        out = {}
        for line in body.splitlines():
            if line.startswith("reloadd_state_") and 'consumer="hook"' in line:
                name, value = line.rsplit(" ", 1)
                out[name.split("{")[0]] = float(value)
        return out

    def readyz(self) -> int:
        try:
            return int(urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=5).status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def log_lines(self, needle: str) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if needle in line]


async def prove_failing_disk(bed: Bed, break_disk: Callable[[], None], heal: Callable[[], None], cause: str,
                             scenario: str, reliability: Reliability, n: int = 2000, m: int = 300,
                             quiet: float = QUIET_WINDOW) -> None:
    """The common proof; ``break_disk``/``heal`` make the state's file system fail and recover."""
    await bed.daemon.start()
    await until(bed.daemon.idle, what="daemon ready", thread=True)
    names = [f"f{i:05d}.conf" for i in range(n)]

    break_disk()
    t_broken = time.monotonic()
    await bed.save_paced(names)
    await bed.all_delivered(names)
    await until(lambda: bed.state()["not_persisted"] is not None, what="state not persisted", thread=True)
    # The disk stays broken: the log must not grow with every batch or retry.
    await asyncio.sleep(quiet)
    window = time.monotonic() - t_broken
    errors = bed.log_lines("Failed to persist state of consumer hook")
    batches = bed.daemon.status()["consumers"]["hook"]["batches"]  # type: ignore[index]
    state = bed.state()
    code, text = await asyncio.to_thread(bed.cli_status)
    metrics = await asyncio.to_thread(bed.metrics)
    ready = await asyncio.to_thread(bed.readyz)
    assert code == 3, text
    assert "STATE NOT PERSISTED since " in text and cause in text, text
    assert state["cause"] == cause and state["path"].startswith(str(bed.cfg.parent)), state
    assert metrics["reloadd_state_write_errors_total"] >= 1, metrics
    assert metrics["reloadd_state_unpersisted_seconds"] > READY_MAX_AGE, metrics
    assert ready == 503  # unpersisted longer than ready_max_age: the documented readiness rule
    assert len(errors) <= math.ceil(window / 60), (len(errors), window, errors)
    if window > 75:  # past a minute and a 15 s retry: the second line says how many were not logged
        assert len(errors) == 2 and "more like it since the last line, not logged" in errors[1], errors
    # Retries back off (0.5 s doubling to 15 s), not one per 20 ms batch.
    assert state["write_errors"] <= 2 + window / 0.5, state

    heal()
    await until(lambda: bed.state()["persisted"], what="persisted again", thread=True, timeout=60)
    code, text = await asyncio.to_thread(bed.cli_status)
    assert code == 0, text
    await bed.daemon.kill9()
    before = bed.delivered()
    await bed.daemon.start()
    await until(bed.daemon.idle, what="daemon idle after restart", thread=True, timeout=60)
    again = sum((bed.delivered() - before).values())
    assert again == 0  # persisted once the disk took writes again: nothing handed over again
    reliability.record(
        f"state disk {scenario}: {n} files saved while every state write fails, then healed, kill -9, restart",
        trials=1, expected=n, delivered=sum(1 for x in names if bed.delivered()[x]), duplicates=again,
        notes=(f"status exit 3 and `STATE NOT PERSISTED`, /readyz 503 after {READY_MAX_AGE:g}s; "
               f"{len(errors)} log line(s) in {window:.0f}s for {batches} batches (bound: 1 a minute per cause), "
               f"{state['write_errors']} failed writes (backoff); persisted again once healed, "
               f"0 handed over again after the restart"))

    # Broken again, and killed before it heals: what was acknowledged meanwhile is handed over again.
    more = [f"g{i:05d}.conf" for i in range(m)]
    break_disk()
    bed.save(more)
    await bed.all_delivered(more)
    await until(lambda: bed.state()["not_persisted"] is not None, what="state not persisted", thread=True)
    await bed.daemon.kill9()
    heal()
    before = bed.delivered()
    await bed.daemon.start()
    await bed.all_delivered(more)
    await until(bed.daemon.idle, what="daemon idle after restart", thread=True, timeout=60)
    diff = bed.delivered() - before
    again = sum(diff.values())
    assert set(diff) <= set(more), sorted(set(diff) - set(more))[:5]  # only what was not persisted
    assert all(bed.delivered()[x] for x in names + more)
    reliability.record(
        f"state disk {scenario}: {m} files saved while it fails, kill -9 before it heals, restart",
        trials=1, expected=m, delivered=sum(1 for x in more if bed.delivered()[x]), duplicates=again,
        notes=f"{again} of {m} handed over again after the restart (acknowledged while not persisted); 0 lost")
    assert await bed.daemon.stop() == 0


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "state", "1m") as state:
        yield state


async def test_state_disk_full(tmp_path: Path, small_tmpfs: Path, reliability: Reliability) -> None:
    bed = Bed(tmp_path, small_tmpfs / "reloadd")
    filler = small_tmpfs / "filler"

    await prove_failing_disk(bed, lambda: fill(filler) and None, filler.unlink, "No space left on device",
                             "full (1 MiB tmpfs)", reliability, quiet=MINUTE_WINDOW)


async def test_state_disk_remounted_read_only(tmp_path: Path, small_tmpfs: Path, reliability: Reliability) -> None:
    bed = Bed(tmp_path, small_tmpfs / "reloadd")
    await prove_failing_disk(bed, lambda: remount(small_tmpfs, "ro"), lambda: remount(small_tmpfs, "rw"),
                             "Read-only file system", "remounted read-only while running", reliability, n=500)


async def test_state_disk_eio_on_write(tmp_path: Path, reliability: Reliability) -> None:
    switch = tmp_path / "eio.on"
    with eio_fs(tmp_path / "backing", tmp_path / "state", switch) as state:
        bed = Bed(tmp_path, state / "reloadd")
        await prove_failing_disk(bed, switch.touch, switch.unlink, "Input/output error",
                                 "EIO on write (FUSE)", reliability, n=500)
    os.sync()


async def test_state_disk_read_only_at_start_is_refused_with_a_clear_message(tmp_path: Path,
                                                                             small_tmpfs: Path) -> None:
    """Read-only before the start: refused, naming the directory and the cause (the state lock no longer
    opens for writing, so this is now said by the first write the records need, not by the lock)."""
    bed = Bed(tmp_path, small_tmpfs / "reloadd")
    await bed.daemon.start()
    await until(bed.daemon.idle, what="daemon ready", thread=True)
    assert await bed.daemon.stop() == 0
    remount(small_tmpfs, "ro")
    await bed.daemon.start()
    assert bed.daemon.proc is not None
    assert await asyncio.wait_for(bed.daemon.proc.wait(), 60) == 1
    text = bed.log.read_text()
    assert "Read-only file system" in text and str(small_tmpfs / "reloadd") in text, text[-2000:]
