"""Crash matrix for the exec consumer: SIGKILL `reloadd run` before, during and after a hook's side effect.

The hook mirrors the watched folder into ``out/`` one file at a time and logs each copy.
Each cycle changes some files, kills the daemon (and its hook) at one point, restarts it
and waits until ``out/`` equals the folder. Every change must land (lost = 0) and a copy
may only be repeated where the kill came before the engine durably recorded the
acknowledgement (read back from its state dir right after the kill).
"""

from __future__ import annotations

import asyncio
import random
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reloadd import Fingerprint
from reloadd._state._records import RecordStore
from tests.daemon_config import hook_daemon_config
from tests.faults._daemon import Daemon
from tests.waiting import until

pytestmark = pytest.mark.timeout(300)

HOOK = textwrap.dedent(
    """
    import json, os, sys, time
    here = os.environ["CRASH_DIR"]
    out = os.path.join(here, "out")
    os.makedirs(out, exist_ok=True)
    batch = json.load(sys.stdin)

    def log(line):
        with open(os.path.join(here, "hook.log"), "a") as f:
            f.write(line + "\\n")

    def block(phase):
        arm = os.path.join(here, "arm-" + phase)
        try:
            os.rename(arm, arm + ".taken")  # exactly one batch claims the arm
        except FileNotFoundError:
            return
        open(os.path.join(here, "blocked-" + phase), "w").close()
        # blocked until reloadd is killed: then gone as if killed with it, writing nothing (it runs in
        # a session of its own, so the test's kill -9 of reloadd does not reach it)
        parent, until = os.getppid(), time.monotonic() + 300
        while os.getppid() == parent and time.monotonic() < until:
            time.sleep(0.05)
        os._exit(0)

    me = str(os.getpid())
    log("batch " + me + " " + " ".join(os.path.basename(c["path"]) for c in batch["changes"]))
    block("before")
    for i, c in enumerate(batch["changes"]):
        name = os.path.basename(c["path"])
        try:
            with open(c["path"], "rb") as f:
                data = f.read().decode()
        except FileNotFoundError:
            data = None
        dst = os.path.join(out, name)
        if data is None:
            if os.path.exists(dst):
                os.unlink(dst)
            log("done " + name + " -")
        else:
            with open(dst + ".tmp", "w") as f:
                f.write(data)
            os.replace(dst + ".tmp", dst)
            log("done " + name + " " + data)
        time.sleep(float(os.environ.get("HOOK_ITEM_SECONDS", "0")))
        if i == 0:
            block("during")  # part of the batch applied, the rest not
    block("after")  # every side effect done, not yet acknowledged
    log("end " + me)
    """
)


@dataclass
class Tally:
    """Figures over all cycles of one matrix run."""

    trials: int = 0
    expected: int = 0
    delivered: int = 0
    duplicates: int = 0
    beyond_interrupted: int = 0
    lost: int = 0
    phases: Counter[str] = field(default_factory=Counter)


def unacknowledged(state: Path, root: Path) -> set[str]:
    """Names whose current state the engine had not durably acknowledged (read from its state dir)."""
    store = RecordStore(state)
    store.load()
    out = {p.name for p in store if not p.exists()}  # deleted, the delete not yet acknowledged
    for p in root.iterdir():
        rec = store.get(p)
        if rec is None or rec.fingerprint != Fingerprint.from_stat(p.stat()):
            out.add(p.name)
    return out


def disarm(d: Path) -> None:
    for f in (*d.glob("arm-*"), *d.glob("blocked-*")):
        f.unlink()


def read_log(d: Path) -> list[list[str]]:
    p = d / "hook.log"
    return [line.split(" ") for line in p.read_text().splitlines()] if p.exists() else []


def desired(root: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in root.iterdir() if p.is_file()}


def mirrored(out: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in out.iterdir() if p.is_file() and not p.name.endswith(".tmp")} \
        if out.exists() else {}


async def crash_matrix(tmp_path: Path, cycles: list[str], seed: int) -> Tally:
    root = tmp_path / "root"
    root.mkdir()
    sock = tmp_path / "ctl.sock"
    # rescan_interval: a safety net if inotify is degraded (watch limit) meanwhile.
    cfg = hook_daemon_config(tmp_path, root, hook=HOOK, control_socket=sock, quiet="300ms", max_delay="2s",
                             rescan_interval="1s")
    daemon = Daemon(cfg, tmp_path / "daemon.log", env={"CRASH_DIR": str(tmp_path), "HOOK_ITEM_SECONDS": "0.03"},
                    control_socket=sock)
    rng = random.Random(seed)
    names = [f"f{i:02d}.conf" for i in range(24)]
    version = 0
    tally = Tally()
    last_done: dict[str, str] = {}

    def converged() -> bool:
        return mirrored(tmp_path / "out") == desired(root)

    await daemon.start()
    try:
        await until(daemon.idle, what="first start")
        for phase in cycles:
            log_mark = len(read_log(tmp_path))
            # 1. change some files: new content, deletions, new files (each value unique)
            changed = 0
            for name in rng.sample(names, rng.randint(4, 10)):
                p = root / name
                if p.exists() and rng.random() < 0.3:
                    p.unlink()
                else:
                    version += 1
                    p.write_text(f"v{version}")
                changed += 1
            tally.expected += changed
            # 2. kill at the chosen point
            if phase in ("before", "during", "after"):
                (tmp_path / f"arm-{phase}").write_text("")
                await until(lambda ph=phase: (tmp_path / f"blocked-{ph}").exists(), what=f"hook blocked {phase}")
            elif phase == "settling":
                pass  # within the 300 ms quiet period: nothing handed over yet
            else:  # "random": anywhere in the settle/handle window
                await asyncio.sleep(rng.uniform(0.0, 1.2))  # the random kill point itself
            await daemon.kill9()
            disarm(tmp_path)
            entries = read_log(tmp_path)[log_mark:]
            started = {e[1]: e[2:] for e in entries if e[0] == "batch"}
            ended = {e[1] for e in entries if e[0] == "end"}
            interrupted = {n for pid, ns in started.items() if pid not in ended for n in ns}
            unacked = unacknowledged(tmp_path / "state" / "consumers" / "hook", root)
            tally.phases[phase if phase != "random" else
                         ("random/idle" if not entries else "random/mid-batch" if interrupted else
                          "random/after-batch")] += 1
            # 3. restart and wait for out/ == root/
            await daemon.start()
            await until(converged, what="out/ to equal the folder")
            await until(daemon.idle, what="idle after restart")
            # 4. count: a repeated copy of the same value is duplicate work
            entries = read_log(tmp_path)[log_mark:]
            cycle_dups = Counter[str]()
            for e in entries:
                if e[0] != "done":
                    continue
                name, value = e[1], " ".join(e[2:])
                if last_done.get(name) == value:
                    cycle_dups[name] += 1
                else:
                    tally.delivered += 1
                last_done[name] = value
            tally.duplicates += sum(cycle_dups.values())
            # redoing is fine only where the engine had not durably recorded the ack at the kill
            tally.beyond_interrupted += sum(n for name, n in cycle_dups.items() if name not in unacked)
            tally.beyond_interrupted += sum(max(0, n - 1) for name, n in cycle_dups.items() if name in unacked)
            tally.trials += 1
    finally:
        await daemon.stop()
    tally.lost = sum(1 for n, v in desired(root).items() if mirrored(tmp_path / "out").get(n) != v)
    tally.lost += sum(1 for n in mirrored(tmp_path / "out") if n not in desired(root))
    return tally


def record(reliability, tally: Tally, scenario: str) -> None:
    phases = ", ".join(f"{k} {v}" for k, v in sorted(tally.phases.items()))
    reliability.record(scenario, trials=tally.trials, expected=tally.expected, delivered=tally.delivered,
                       duplicates=tally.duplicates, lost=tally.lost,
                       notes=f"kill points: {phases}; repeats of work already acknowledged: "
                             f"{tally.beyond_interrupted}")


async def test_exec_sigkill_matrix(tmp_path, reliability):
    cycles = ["settling", "before", "during", "after", "random", "random"]
    tally = await crash_matrix(tmp_path, cycles, seed=11)
    record(reliability, tally, "exec: SIGKILL reloadd before/during/after the hook, restart")
    assert tally.lost == 0
    assert tally.delivered == tally.expected  # every change applied once, intermediate-free by construction
    assert tally.beyond_interrupted == 0


@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_exec_sigkill_matrix_long(tmp_path, reliability):
    rng = random.Random(5)
    cycles = [rng.choice(["settling", "before", "during", "after", "random", "random"]) for _ in range(40)]
    tally = await crash_matrix(tmp_path, cycles, seed=5)
    record(reliability, tally, "exec: SIGKILL matrix, 40 random cycles")
    assert tally.lost == 0
    assert tally.delivered == tally.expected
    assert tally.beyond_interrupted == 0
