"""Run a command for a plugin: bounded in time, its whole process group killed on timeout or cancel.

Used by the ``exec`` plugin (one run per batch) and by registry-mirrors' notify command.
A shell script's children are killed with it (the command runs in its own session), so
a hung hook never outlives reloadd's patience or its shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ._errors import TransientError

__all__ = ["CommandError", "CommandResult", "run_command"]


class CommandError(TransientError):
    """The command could not be started, or ran out of time (its process group was killed)."""


@dataclass(frozen=True, slots=True)
class CommandResult:
    """How a command ended."""

    argv: tuple[str, ...]
    returncode: int
    output: bytes
    """What it wrote to the captured stream(s)."""
    errors: bytes = b""
    """What it wrote to stderr, when captured apart (``capture="stdout"``)."""

    @property
    def ok(self) -> bool:
        """Exit status 0."""
        return self.returncode == 0

    def describe(self, lines: int = 3) -> str:
        """``<cmd> exited with N: last | lines`` for error messages."""
        tail = self.output.decode(errors="replace").strip().splitlines()[-lines:]
        detail = f": {' | '.join(tail)}" if tail else ""
        return f"{self.argv[0]} exited with {self.returncode}{detail}"


async def run_command(
    argv: Sequence[str],
    *,
    timeout: float,
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    capture: str = "both",
) -> CommandResult:
    """Run ``argv`` to completion.

    Args:
        argv: The command and its arguments (no shell).
        timeout: Seconds before the process group is killed.
        stdin: Bytes written to its stdin (``None``: /dev/null).
        env: The environment (``None``: reloadd's own).
        cwd: Its working directory.
        capture: ``"both"`` (stdout and stderr together), ``"stderr"`` (stdout to /dev/null),
            ``"stdout"`` (stdout as ``output``, stderr apart as ``errors``: a command that answers
            in JSON, like a kubeconfig exec credential plugin).

    Raises:
        CommandError: it could not be started, or timed out (then it was killed).
        asyncio.CancelledError: after killing its process group.
    """
    pipe, devnull = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=pipe if stdin is not None else devnull,
            stdout=devnull if capture == "stderr" else pipe,
            stderr=asyncio.subprocess.STDOUT if capture == "both" else pipe,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        raise CommandError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate(stdin)
    except TimeoutError:
        await _kill(proc)
        raise CommandError(f"{argv[0]} timed out after {timeout:g}s (killed)") from None
    except asyncio.CancelledError:
        await _kill(proc)
        raise
    assert proc.returncode is not None
    if capture == "stdout":
        return CommandResult(tuple(argv), proc.returncode, out or b"", err or b"")
    return CommandResult(tuple(argv), proc.returncode, (out if capture == "both" else err) or b"")


async def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(asyncio.CancelledError, TimeoutError):
        async with asyncio.timeout(5):
            await proc.wait()
