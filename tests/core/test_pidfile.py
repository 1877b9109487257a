"""Pid files: atomic, never through a symlink, removed on exit; a pid is validated before a signal.

Regressions: the pid file was written with ``write_text`` (through a symlink planted at
its path, and non-atomically), and ``reloadd reload`` signalled whatever number it held:
``-1`` as root is every process on the machine, ``0`` is the caller's process group.

The ``reload`` cases with -1 and 0 run the CLI with every signal-sending call recorded
instead of made, so a regression cannot signal anything.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reloadd import ReloaddError, read_pid_file, signal_pid_file
from reloadd._ops._pidfile import looks_like, remove_pid_file, write_pid_file
from tests.daemon_config import hook_daemon_config

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not reloadd (a pid that was reused by something else)."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_write_replaces_a_symlink_instead_of_following_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    pid_file = tmp_path / "run" / "reloadd.pid"
    pid_file.parent.mkdir()
    pid_file.symlink_to(victim)
    dangling = tmp_path / "run" / "other.pid"
    dangling.symlink_to(tmp_path / "created-through-link")

    old = os.umask(0o077)  # the mode must not depend on the caller's umask
    try:
        write_pid_file(pid_file)
        write_pid_file(dangling, pid=4242)
    finally:
        os.umask(old)

    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "created-through-link").exists()
    for path, pid in ((pid_file, os.getpid()), (dangling, 4242)):
        st = path.lstat()
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644
        assert path.read_text() == f"{pid}\n"
    assert sorted(p.name for p in pid_file.parent.iterdir()) == ["other.pid", "reloadd.pid"]  # no temp left


def test_write_errors_name_the_file(tmp_path):
    target = tmp_path / "is-a-dir"
    (target / "child").mkdir(parents=True)
    with pytest.raises(ReloaddError, match=rf"Failed to write pid file {target}: "):
        write_pid_file(target)
    assert [p.name for p in target.parent.iterdir()] == ["is-a-dir"]  # the temp file is cleaned up


def test_remove_only_our_own_pid_file(tmp_path):
    p = tmp_path / "reloadd.pid"
    write_pid_file(p, pid=4242)
    assert not remove_pid_file(p) and p.exists()  # a newer daemon's file stays
    write_pid_file(p)
    assert remove_pid_file(p) and not p.exists()
    assert not remove_pid_file(p)  # already gone: no error


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("-1\n", "expected a process id, got '-1\\n'"),
        ("0\n", "pid 0 is not a daemon's pid"),
        ("1\n", "pid 1 is not a daemon's pid"),
        ("", "expected a process id, got ''"),
        ("garbage\n", "expected a process id, got 'garbage\\n'"),
        ("12 34\n", "expected a process id"),
        ("0x10\n", "expected a process id"),
        ("99999999999999999999999\n", "expected a process id"),
        ("4194304999\n", "pid 4194304999 is beyond the kernel's limit"),
        ("4194303\n", "no process 4194303 is running (stale pid file)"),
        ("7" * 100, "expected a process id"),
    ],
)
def test_bad_pids_are_refused(tmp_path, content, message):
    p = tmp_path / "reloadd.pid"
    p.write_text(content)
    with pytest.raises(ReloaddError) as err:
        signal_pid_file(p, signal.SIGHUP)
    assert str(err.value).startswith(f"Refusing pid file {p}: "), err.value
    assert message in str(err.value)


def test_stale_and_foreign_pids_are_refused(tmp_path, sleeper):
    p = tmp_path / "reloadd.pid"
    gone = dead_pid()
    p.write_text(f"{gone}\n")
    with pytest.raises(ReloaddError, match=rf"no process {gone} is running \(stale pid file\)"):
        signal_pid_file(p, signal.SIGTERM)

    p.write_text(f"{sleeper.pid}\n")
    with pytest.raises(ReloaddError, match=rf"process {sleeper.pid} is 'sleep 60', not reloadd"):
        signal_pid_file(p, signal.SIGTERM)
    assert sleeper.poll() is None  # not signalled
    assert read_pid_file(p, expect="sleep") == sleeper.pid


def test_a_symlink_is_not_read(tmp_path, sleeper):
    real = tmp_path / "real.pid"
    real.write_text(f"{sleeper.pid}\n")
    link = tmp_path / "reloadd.pid"
    link.symlink_to(real)
    with pytest.raises(ReloaddError, match=rf"Refusing pid file {link}: it is a symlink"):
        signal_pid_file(link, signal.SIGTERM, expect="sleep")
    assert sleeper.poll() is None
    fifo = tmp_path / "fifo.pid"
    os.mkfifo(fifo)
    with pytest.raises(ReloaddError, match="not a regular file"):
        read_pid_file(fifo)


def test_reloadd_command_lines():
    assert looks_like(b"/usr/bin/reloadd\0run\0--config\0x\0", "reloadd")
    assert looks_like(b"/usr/bin/python3\0/opt/venv/bin/reloadd\0run\0", "reloadd")
    assert looks_like(b"python3\0-m\0reloadd\0run\0", "reloadd")
    assert not looks_like(b"python3\0-m\0reloadd_exec\0", "reloadd")
    assert not looks_like(b"less\0reloadd\0", "reloadd")  # argv[1] counts only after a Python interpreter
    assert not looks_like(b"bash\0-c\0echo reloadd\0", "reloadd")
    assert not looks_like(b"/usr/bin/reloadd-evil\0", "reloadd")


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reloadd", *args, "--config", str(config)],
                          capture_output=True, text=True, timeout=30)


# ``reloadd reload`` with every way of sending a signal replaced by a recorder, so that a
# regression (``kill(-1, SIGHUP)`` as root) records a call instead of signalling every process.
SAFE_RELOAD = """
import json, os, signal, sys
sent = []
os.kill = lambda pid, sig: sent.append(["kill", pid, sig])
os.killpg = lambda pid, sig: sent.append(["killpg", pid, sig])
signal.pidfd_send_signal = lambda fd, sig, *a: sent.append(["pidfd", fd, sig])
from reloadd.cli import main
code = main(["reload", "--config", sys.argv[1]])
print(json.dumps({"code": code, "sent": sent}))
"""


@pytest.mark.parametrize("content", ["-1\n", "0\n", "1\n", "garbage\n", "stale", "foreign"])
def test_reload_refuses_a_bad_pid_file(tmp_path, sleeper, content, reliability):
    pid_file = tmp_path / "reloadd.pid"
    pid_file.write_text({"stale": f"{dead_pid()}\n", "foreign": f"{sleeper.pid}\n"}.get(content, content))
    cfg = tmp_path / "reloadd.toml"
    cfg.write_text(f'[reloadd]\nstate_dir = "{tmp_path / "state"}"\npid_file = "{pid_file}"\n')
    res = subprocess.run([sys.executable, "-c", SAFE_RELOAD, str(cfg)], capture_output=True, text=True, timeout=30)
    assert json.loads(res.stdout.splitlines()[-1]) == {"code": 1, "sent": []}, (res.stdout, res.stderr)
    assert f"reloadd: cannot signal the daemon: Refusing pid file {pid_file}: " in res.stderr
    assert "Traceback" not in res.stderr
    assert sleeper.poll() is None
    sent = json.loads(res.stdout.splitlines()[-1])["sent"]
    reliability.record(f"`reloadd reload` with a pid file holding {content.strip()!r}", trials=1, expected=0,
                       delivered=len(sent), notes="refused with a message naming the pid file; signals sent: "
                       f"{len(sent)}; the unrelated process {'alive' if sleeper.poll() is None else 'killed'}")


def test_reload_refuses_a_foreign_process_end_to_end(tmp_path, sleeper):
    pid_file = tmp_path / "reloadd.pid"
    pid_file.write_text(f"{sleeper.pid}\n")
    cfg = tmp_path / "reloadd.toml"
    cfg.write_text(f'[reloadd]\nstate_dir = "{tmp_path / "state"}"\npid_file = "{pid_file}"\n')
    res = cli(cfg, "reload")
    assert res.returncode == 1
    assert (f"reloadd: cannot signal the daemon: Refusing pid file {pid_file}: process {sleeper.pid} is "
            f"'sleep 60', not reloadd (the pid was reused?)") in res.stderr
    assert sleeper.poll() is None  # the old code sent it SIGHUP, which kills sleep


async def test_daemon_writes_pid_file_over_a_symlink_and_removes_it(tmp_path):
    """End to end: ``reloadd run`` does not write through a planted symlink; reload works; exit removes it."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    pid_file = tmp_path / "run" / "reloadd.pid"
    pid_file.parent.mkdir()
    pid_file.symlink_to(victim)
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.conf").write_text("a")
    out = tmp_path / "batches"
    cfg = hook_daemon_config(tmp_path, root, command=["sh", "-c", f"cat > /dev/null; echo x >> {out}"],
                             pid_file=pid_file)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reloadd", "run", "--config", str(cfg), stderr=asyncio.subprocess.PIPE)
    try:
        for _ in range(200):
            if not pid_file.is_symlink() and pid_file.exists() and out.exists():
                break
            await asyncio.sleep(0.05)  # the daemon is another process
        assert not pid_file.is_symlink()
        assert pid_file.read_text() == f"{proc.pid}\n"
        assert stat.S_IMODE(pid_file.stat().st_mode) == 0o644
        assert victim.read_text() == "precious\n"
        res = await asyncio.to_thread(cli, cfg, "reload")
        assert res.returncode == 0, res.stderr
        assert f"asked pid {proc.pid}" in res.stdout
        for _ in range(200):
            if len(out.read_text().split()) >= 2:
                break
            await asyncio.sleep(0.05)
        assert len(out.read_text().split()) >= 2
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert not pid_file.exists() and not pid_file.is_symlink()
    assert victim.read_text() == "precious\n"
