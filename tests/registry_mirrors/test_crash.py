"""Crash matrix for registry-mirrors: SIGKILL `reloadd run` around the hosts.toml writes and the notify hook.

Each cycle rewrites, adds or deletes some drop-ins, kills the daemon (and the notify
command it runs) at one point, restarts it, and waits until every ``hosts.toml`` equals
the render of the inputs (computed with the plugin's own pure pipeline). The notify
command logs the hosts_dir state it was told about, so repeated and missed
notifications are counted too.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import random
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from reloadd_registry_mirrors import Inputs, evaluate, read_snapshot

from tests.faults._daemon import Daemon, tree_snapshot
from tests.waiting import until

pytestmark = pytest.mark.timeout(300)

NOTIFY = textwrap.dedent(
    """
    import hashlib, os, sys, time
    here = os.environ["CRASH_DIR"]
    hosts = os.path.join(here, "certs.d")
    h = hashlib.sha256()
    for d in sorted(os.listdir(hosts)):
        p = os.path.join(hosts, d, "hosts.toml")
        if os.path.isfile(p):
            h.update(d.encode() + b"\\0" + open(p, "rb").read() + b"\\0")
    state = h.hexdigest()[:12]
    me = str(os.getpid())
    with open(os.path.join(here, "notify.log"), "a") as f:
        f.write("start " + me + " " + state + "\\n")
    arm = os.path.join(here, "arm-notify")
    try:
        os.rename(arm, arm + ".taken")
        open(os.path.join(here, "blocked-notify"), "w").close()
        # blocked until reloadd is killed: then gone as if killed with it, writing nothing (it runs in
        # a session of its own, so the test's kill -9 of reloadd does not reach it)
        parent, until = os.getppid(), time.monotonic() + 300
        while os.getppid() == parent and time.monotonic() < until:
            time.sleep(0.05)
        os._exit(0)
    except FileNotFoundError:
        pass
    with open(os.path.join(here, "notify.log"), "a") as f:
        f.write("done " + me + " " + state + "\\n")
    """
)


@dataclass
class Tally:
    trials: int = 0
    expected: int = 0
    delivered: int = 0
    lost: int = 0
    notify_repeats: int = 0
    notify_missed: int = 0
    stray: int = 0
    unlike_render: int = 0
    phases: Counter[str] = field(default_factory=Counter)


def drop_in(host: str, version: int) -> str:
    return (f'[[registry]]\nprefix = "{host}"\nlocation = "{host}"\n'
            f'[[registry.mirror]]\nlocation = "mirror-v{version}.example.net"\n')


def state_id(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for d in sorted(files):
        h.update(d.encode() + b"\0" + files[d].encode() + b"\0")
    return h.hexdigest()[:12]


def on_disk(hosts: Path) -> dict[str, str]:
    if not hosts.exists():
        return {}
    return {d.name: (d / "hosts.toml").read_text() for d in hosts.iterdir() if (d / "hosts.toml").is_file()}


def reflects(hosts: Path, host: str, version: int | None) -> bool:
    """Whether ``hosts_dir`` shows the drop-in change the test made: mirror ``version``, or (None) no file.

    Read from disk with the test's own knowledge of what it wrote, independently of the plugin's
    render, so a stale or wrong render counts as lost instead of agreeing with itself.
    """
    f = hosts / host / "hosts.toml"
    if version is None:
        return not f.exists()
    return f.is_file() and f'"https://mirror-v{version}.example.net"' in f.read_text()


def disarm(d: Path) -> None:
    for f in (*d.glob("arm-*"), *d.glob("blocked-*")):
        f.unlink()


def notify_log(d: Path) -> list[list[str]]:
    p = d / "notify.log"
    return [line.split() for line in p.read_text().splitlines()] if p.exists() else []


async def crash_matrix(tmp_path: Path, cycles: list[str], seed: int) -> Tally:
    etc = tmp_path / "etc"
    conf_d = etc / "registries.conf.d"
    conf_d.mkdir(parents=True)
    hosts = tmp_path / "certs.d"
    (tmp_path / "notify.py").write_text(NOTIFY)
    sock = tmp_path / "ctl.sock"
    cfg = tmp_path / "reloadd.toml"
    cfg.write_text(textwrap.dedent(f"""
        [reloadd]
        state_dir = "{tmp_path / 'state'}"
        control_socket = "{sock}"
        quiet = "300ms"
        max_delay = "2s"
        rescan_interval = "1s"  # a safety net if inotify is degraded (watch limit) meanwhile
        [[consumer]]
        name = "mirrors"
        plugin = "registry-mirrors"
        [consumer.options]
        registries_conf = "{etc / 'registries.conf'}"
        registries_conf_d = "{conf_d}"
        hosts_dir = "{hosts}"
        certs_dirs = []
        containerd_config = ""
        [consumer.options.notify]
        command = ["{sys.executable}", "{tmp_path / 'notify.py'}"]
    """))
    inputs = Inputs(etc / "registries.conf", conf_d)
    daemon = Daemon(cfg, tmp_path / "daemon.log", env={"CRASH_DIR": str(tmp_path)}, control_socket=sock)
    rng = random.Random(seed)
    names = [f"h{i:02d}.example.com" for i in range(16)]
    version = 0
    tally = Tally()
    hosts.mkdir()
    outside_before = tree_snapshot(tmp_path, skip=(hosts, tmp_path / "state", tmp_path / "notify.log",
                                                   tmp_path / "daemon.log", sock, conf_d))

    async def wanted() -> dict[str, str]:
        rendered = evaluate(inputs, await read_snapshot(inputs)).rendered
        assert rendered is not None
        return dict(rendered.files)

    await daemon.start()
    try:
        await until(daemon.idle, what="first start")
        for phase in cycles:
            mark = len(notify_log(tmp_path))
            changed: dict[str, int | None] = {}  # host -> mirror version written, None = drop-in deleted
            for host in rng.sample(names, rng.randint(3, 8)):
                p = conf_d / f"50-{host}.conf"
                if p.exists() and rng.random() < 0.3:
                    p.unlink()
                    changed[host] = None
                else:
                    version += 1
                    p.write_text(drop_in(host, version))
                    changed[host] = version
            tally.expected += len(changed)
            if phase == "notify":  # hosts.toml written, notify running, nothing acknowledged
                (tmp_path / "arm-notify").write_text("")
                await until(lambda: (tmp_path / "blocked-notify").exists(), what="notify blocked")
            elif phase == "random":
                await asyncio.sleep(rng.uniform(0.0, 0.8))  # the random kill point itself
            await daemon.kill9()
            applied_at_kill = on_disk(hosts) == await wanted()
            disarm(tmp_path)
            entries = notify_log(tmp_path)[mark:]
            cut = {e[1] for e in entries if e[0] == "start"} - {e[1] for e in entries if e[0] == "done"}
            label = phase
            if phase == "random":
                label = ("random/in notify" if cut else "random/after notify" if entries
                         else "random/after apply" if applied_at_kill else "random/before or mid apply")
            tally.phases[label] += 1
            await daemon.start()
            want = await wanted()
            await until(lambda w=want: on_disk(hosts) == w, what="hosts.toml == render(inputs)")  # type: ignore[misc]
            await until(daemon.idle, what="idle after restart")
            got = on_disk(hosts)
            tally.unlike_render += sum(1 for h in set(want) | set(got) if want.get(h) != got.get(h))
            reached = sum(1 for h, v in changed.items() if reflects(hosts, h, v))
            tally.delivered += reached
            tally.lost += len(changed) - reached
            # notifications: the final state must have been announced; a state told twice is a repeat
            entries = notify_log(tmp_path)[mark:]
            told = [e[2] for e in entries if e[0] == "done"]
            tally.notify_repeats += sum(1 for a, b in itertools.pairwise(told) if a == b)
            if state_id(got) not in told:
                tally.notify_missed += 1
            tally.stray += sum(1 for p in hosts.rglob("*") if p.is_file() and p.name != "hosts.toml")
            tally.trials += 1
    finally:
        await daemon.stop()
    outside_after = tree_snapshot(tmp_path, skip=(hosts, tmp_path / "state", tmp_path / "notify.log",
                                                  tmp_path / "daemon.log", sock, conf_d))
    assert outside_after == outside_before  # nothing written anywhere but hosts_dir
    return tally


def record(reliability, tally: Tally, scenario: str) -> None:
    phases = ", ".join(f"{k} {v}" for k, v in sorted(tally.phases.items()))
    reliability.record(scenario, trials=tally.trials, expected=tally.expected, delivered=tally.delivered,
                       duplicates=tally.notify_repeats, lost=tally.lost,
                       notes=f"kill points: {phases}; delivered = changed drop-ins whose mirror version (or "
                             f"removal) is on disk; duplicates = notify repeated for one state; "
                             f"final state never notified in {tally.notify_missed} cycle(s); "
                             f"hosts.toml unlike the render {tally.unlike_render}; stray temp files {tally.stray}")


async def test_mirrors_sigkill_matrix(tmp_path, reliability):
    tally = await crash_matrix(tmp_path, ["settling", "notify", "random", "random", "random"], seed=3)
    record(reliability, tally, "registry-mirrors: SIGKILL reloadd around hosts.toml writes and notify, restart")
    assert tally.lost == 0
    assert tally.delivered == tally.expected
    assert tally.unlike_render == 0
    assert tally.stray == 0


async def test_mirrors_notify_is_rerun_after_a_kill_during_notify(tmp_path):
    tally = await crash_matrix(tmp_path, ["notify"], seed=1)
    assert tally.lost == 0
    assert tally.notify_missed == 0


@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_mirrors_sigkill_matrix_long(tmp_path, reliability):
    rng = random.Random(9)
    cycles = [rng.choice(["settling", "notify", "random", "random", "random"]) for _ in range(30)]
    tally = await crash_matrix(tmp_path, cycles, seed=9)
    record(reliability, tally, "registry-mirrors: SIGKILL matrix, 30 random cycles")
    assert tally.lost == 0
    assert tally.delivered == tally.expected
    assert tally.unlike_render == 0
    assert tally.stray == 0
