"""``reloadd run`` as a subprocess: control socket, ``reloadd status``/``reload``, JSON logs, sd_notify."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_config import write_config
from tests.waiting import until

from .support import Daemon, Hook, free_port, run_daemon, sample, scrape, short_dir

pytestmark = pytest.mark.timeout(90)

SECRET_OPTION = "--password=opt-s3cret"
SECRET_URL = "https://admin:hunter2@registry.example/v2/"


@pytest.fixture
def sdir() -> Iterator[Path]:
    d = short_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def daemon_config(d: Path, hook: Hook, **settings: object) -> Path:
    (d / "watched").mkdir(exist_ok=True)
    reloadd = {"state_dir": str(d / "state"), "quiet": "50ms", "max_delay": "1s",
               "control_socket": str(d / "ctl.sock"), **settings}
    return write_config(d / "reloadd.toml", reloadd,
                        [{"name": "hook", "plugin": "exec", "paths": [str(d / "watched")],
                          "options": {"command": [*hook.command, SECRET_OPTION]}}])


async def status_json(daemon: Daemon) -> Any:
    code, out, err = await daemon.cli("status", "--json")
    assert code in (0, 3), err
    return json.loads(out)


async def wait_socket(daemon: Daemon, path: Path) -> None:
    async def up() -> bool:
        assert daemon.proc.returncode is None, daemon.stderr()
        return path.exists()  # noqa: ASYNC240 - one stat

    await until(up, what=str(path))


async def test_status_shows_failing_path_with_error_over_a_0600_socket(sdir: Path) -> None:
    hook = Hook.make(sdir / "hook")
    cfg = daemon_config(sdir, hook)
    async with run_daemon(cfg, "--log-format", "json") as daemon:
        sock = sdir / "ctl.sock"
        await wait_socket(daemon, sock)
        st = os.stat(sock)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600

        (sdir / "watched" / "good.txt").write_text("ok")

        async def acked() -> bool:
            doc = await status_json(daemon)
            return bool(doc["consumers"]["hook"]["records"] == 1)

        await until(acked, what="good.txt acknowledged")
        code, out, _ = await daemon.cli("status")
        assert code == 0, out
        assert "ready" in out.splitlines()[0] and "consumer hook (reloadd_exec)" in out

        hook.fail(1, f"push to {SECRET_URL} failed: token=tok-s3cret")
        bad = sdir / "watched" / "bad.txt"
        bad.write_text("bad")

        seen: list[Any] = []

        async def failing() -> bool:  # keep the document that shows it (a retry may be in flight later)
            seen.append(await status_json(daemon))
            return bool(seen[-1]["consumers"]["hook"]["failing"])

        await until(failing, what="bad.txt failing")
        doc = seen[-1]
        c = doc["consumers"]["hook"]
        assert c["roots"] == [str(sdir / "watched")]
        [f] = c["failing"]
        assert f["path"] == str(bad) and f["attempts"] >= 1 and f["next_retry_at"] > 0
        assert "exited with 1" in f["error"] and "registry.example" in f["error"]
        assert doc["watch"] == "armed" and doc["pid"] == daemon.proc.pid

        async def shown() -> bool:  # the human table, taken while the path waits for its retry
            code, seen_out, _ = await daemon.cli("status")
            seen.append({"out": seen_out, "code": code})
            return f"FAILING:   {bad}: attempt" in seen_out

        await until(shown, what="the failing path in the table")
        out = str(seen[-1]["out"])
        assert seen[-1]["code"] == 3  # answered, but something is failing
        assert "retry in" in out and "exited with 1" in out

        out_json = json.dumps(doc)  # what `reloadd status --json` printed while the path was failing
        for text in (out, out_json):
            assert "hunter2" not in text and "tok-s3cret" not in text and "opt-s3cret" not in text
            assert "https://***@registry.example" in text
    # JSON logs: every line parses, and the failure names the path and the cause
    records = [json.loads(line) for line in daemon.stderr().splitlines() if line.strip()]
    assert {"time", "level", "logger", "message"} <= set(records[0])
    failures = [r for r in records if r["level"] in ("warning", "error") and str(bad) in r["message"]]
    assert failures and "exited with 1" in failures[0]["message"]


@pytest.mark.parametrize("via", ["control-socket", "sighup"])
async def test_reload_produces_one_forced_resync(sdir: Path, via: str) -> None:
    hook = Hook.make(sdir / "hook")
    port = free_port()
    cfg = daemon_config(sdir, hook, metrics_listen=f"127.0.0.1:{port}", pid_file=str(sdir / "reloadd.pid"))
    if via == "sighup":  # no control socket: `reloadd reload` signals the pid in pid_file
        cfg.write_text(cfg.read_text().replace(f'control_socket = "{sdir / "ctl.sock"}"\n', ""))
    for name in ("a.txt", "b.txt"):
        (sdir / "watched" / name).write_text(name)
    async with run_daemon(cfg) as daemon:
        base = f"http://127.0.0.1:{port}"
        await wait_socket(daemon, sdir / ("ctl.sock" if via == "control-socket" else "reloadd.pid"))

        async def started() -> bool:
            return len([c for b in hook.calls() for c in b["changes"]]) == 2

        await until(started, what="the initial pass")
        m = await scrape(base)
        assert sample(m, "reloadd_resyncs_total") == 0

        code, out, err = await daemon.cli("reload")
        assert code == 0, err
        assert ("on " + str(sdir / "ctl.sock") if via == "control-socket" else "asked pid") in out

        async def resynced() -> bool:
            m = await scrape(base)
            return (sample(m, "reloadd_resyncs_total") == 1
                    and sample(m, "reloadd_consumer_queue_depth", consumer="hook") == 0
                    and sample(m, "reloadd_consumer_in_flight", consumer="hook") == 0
                    and len([b for b in hook.calls() if b["reason"] == "signal"]) >= 1)

        await until(resynced, what="one resync handled")
        signal_batches = [b for b in hook.calls() if b["reason"] == "signal"]
        assert sorted(c["path"] for b in signal_batches for c in b["changes"]) == [
            str(sdir / "watched" / "a.txt"), str(sdir / "watched" / "b.txt")]
        if via == "sighup":
            assert not (sdir / "ctl.sock").exists()
        assert sample(await scrape(base), "reloadd_consumer_batches_total", consumer="hook") == len(hook.calls())


async def test_status_without_a_daemon_exits_1(sdir: Path) -> None:
    cfg = daemon_config(sdir, Hook.make(sdir / "hook"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reloadd", "status", "--config", str(cfg),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    assert proc.returncode == 1 and b"cannot reach the daemon" in err


async def test_sd_notify_ready_watchdog_and_stopping(sdir: Path) -> None:
    hook = Hook.make(sdir / "hook")
    cfg = daemon_config(sdir, hook)
    (sdir / "watched" / "initial.txt").write_text("x")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(sdir / "notify.sock"))
    notify.setblocking(False)
    loop = asyncio.get_running_loop()
    messages: list[dict[str, str]] = []

    async def receive(pred: str) -> dict[str, str]:
        while True:
            data = await asyncio.wait_for(loop.sock_recv(notify, 4096), 20)
            msg = dict(line.split("=", 1) for line in data.decode().split("\n") if line)
            messages.append(msg)
            if pred in msg:
                return msg

    try:
        env = {"NOTIFY_SOCKET": str(sdir / "notify.sock"), "WATCHDOG_USEC": "400000"}
        async with run_daemon(cfg, env=env) as daemon:
            ready = await receive("READY")
            assert ready["READY"] == "1" and ready["STATUS"].startswith("ready:")
            # READY=1 comes after the initial pass, not before
            assert [c["path"] for b in hook.calls() for c in b["changes"]] == [str(sdir / "watched" / "initial.txt")]
            before = len([m for m in messages if "WATCHDOG" in m])
            for _ in range(3):
                await receive("WATCHDOG")
            pings = [m for m in messages if "WATCHDOG" in m]
            assert len(pings) >= before + 3 and all(m["WATCHDOG"] == "1" for m in pings)
            daemon.proc.terminate()
            stopping = await receive("STOPPING")
            assert stopping["STOPPING"] == "1"
            assert await asyncio.wait_for(daemon.proc.wait(), 20) == 0
    finally:
        notify.close()


async def test_sd_notify_abstract_socket() -> None:
    from reloadd._ops._sdnotify import Notifier, watchdog_interval

    name = f"reloadd-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    try:
        n = Notifier("@" + name)
        assert n.enabled and n.send(READY=1, STATUS="two\nlines")
        assert sock.recv(4096) == b"READY=1\nSTATUS=two lines"
        n.close()
    finally:
        sock.close()
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({}) is None
    assert not Notifier("").send(READY=1)
