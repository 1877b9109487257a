"""reloadd.run_command: a hung hook and everything it started die on timeout and on cancel."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from reloadd import CommandError, run_command

pytestmark = pytest.mark.timeout(30)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie awaiting its parent counts as gone
        return f.read().split(") ", 1)[1][0] != "Z"


async def gone(pid: int) -> bool:
    for _ in range(100):
        if not alive(pid):
            return True
        await asyncio.sleep(0.05)
    return False


def script(tmp_path: Path) -> tuple[list[str], Path]:
    pidfile = tmp_path / "child.pid"
    return ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], pidfile


def read_pid(pidfile: Path) -> int | None:
    text = pidfile.read_text().strip() if pidfile.exists() else ""
    return int(text) if text else None


async def wait_pid(pidfile: Path) -> int:
    for _ in range(100):
        pid = read_pid(pidfile)
        if pid is not None:
            return pid
        await asyncio.sleep(0.02)
    raise AssertionError("the script did not start its child")


async def test_output_and_exit_status(tmp_path: Path) -> None:
    res = await run_command(["sh", "-c", "cat; echo err >&2; exit 4"], timeout=5, stdin=b"in\n")
    assert (res.returncode, res.output) == (4, b"in\nerr\n")
    assert res.describe() == "sh exited with 4: in | err"
    res = await run_command(["sh", "-c", "echo out; echo err >&2"], timeout=5, capture="stderr")
    assert res.ok and res.output == b"err\n"


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    argv, pidfile = script(tmp_path)
    task = asyncio.create_task(run_command(argv, timeout=1.0))
    child = await wait_pid(pidfile)
    with pytest.raises(CommandError, match=r"sh timed out after 1s \(killed\)"):
        await task
    assert await gone(child), "the script's child outlived the timeout"


async def test_cancel_kills_the_whole_process_group(tmp_path: Path) -> None:
    argv, pidfile = script(tmp_path)
    task = asyncio.create_task(run_command(argv, timeout=60))
    child = await wait_pid(pidfile)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await gone(child), "the script's child outlived the cancel"


async def test_missing_command_names_it() -> None:
    with pytest.raises(CommandError, match="cannot run /nonexistent/hook: No such file or directory"):
        await run_command(["/nonexistent/hook"], timeout=5)
