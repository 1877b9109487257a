"""`reloadd run` as a real subprocess for the fault suite: start, SIGKILL, stop, ask its status."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

from reloadd._ops._control import request


class Daemon:
    """One `reloadd run --config cfg` in its own session, so SIGKILL takes its hooks down with it."""

    def __init__(self, config: Path, log: Path, env: dict[str, str] | None = None,
                 control_socket: Path | None = None, args: tuple[str, ...] = (),
                 prefix: tuple[str, ...] = ()) -> None:
        self.config = config
        self.log = log
        self.env = {**os.environ, **(env or {})}
        self.control_socket = control_socket
        self.args = args
        self.prefix = prefix  # a wrapper command (setpriv dropping capabilities)
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0

    async def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *self.prefix, sys.executable, "-m", "reloadd", *self.args, "run", "--config", str(self.config),
                env=self.env, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )
        self.starts += 1

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def kill9(self) -> None:
        """SIGKILL the daemon and everything it started (hooks, notify commands)."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        await self.proc.wait()

    async def stop(self) -> int:
        """SIGTERM and wait; SIGKILL the group if it does not stop in 30 s."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                await self.kill9()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # leftovers of the session
        return self.proc.returncode if self.proc.returncode is not None else -9

    def status(self) -> dict[str, Any] | None:
        """The daemon's status document over the control socket, ``None`` when it does not answer."""
        if self.control_socket is None:
            return None
        try:
            doc: dict[str, Any] = request(self.control_socket, "status", timeout=2.0)["status"]
        except Exception:  # not up yet, or going down
            return None
        return doc

    def idle(self) -> bool:
        """Started, and no consumer has a pending or in-flight path."""
        doc = self.status()
        if doc is None or not doc.get("ready"):
            return False
        return all(not c["pending"] and not c["in_flight"] for c in doc["consumers"].values())

    async def __aenter__(self) -> Daemon:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.proc is not None:
            await self.stop()


def tree_snapshot(root: Path, skip: tuple[Path, ...] = ()) -> dict[str, tuple[int, int, bytes | None]]:
    """Every entry under ``root`` (symlinks not followed): relative path → (mode, size, content of small files)."""
    out: dict[str, tuple[int, int, bytes | None]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        dirnames[:] = [n for n in dirnames if d / n not in skip]
        for name in dirnames + filenames:
            p = d / name
            if p in skip:
                continue
            st = os.lstat(p)
            data = None
            if os.path.isfile(p) and not os.path.islink(p) and st.st_size <= 65536:
                data = p.read_bytes()
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, data)
    return out
