"""The optional action after a successful apply: run a command, POST a URL, or signal a pid.

containerd needs none (it re-reads hosts.toml on every pull); the hook is for other
readers, e.g. CRI-O, which reloads registries.conf on SIGHUP. A failing notification
is logged and counted, never undoes the apply, and is not retried.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reloadd import CommandError, ConfigError, Options, ReloaddError, run_command, signal_pid_file

__all__ = ["Notifier", "NotifyError"]


class NotifyError(Exception):
    """The notification failed (the apply itself stands)."""


@dataclass(frozen=True, slots=True)
class Notifier:
    """What to do after an apply; every field optional.

    Attributes:
        command: argv run without a shell; gets ``RELOADD_HOSTS`` (space-separated host dirs).
        url: POSTed a JSON body ``{"hosts": [...], "written": [...], "removed": [...]}``.
        pid: A process to signal.
        pid_file: A file holding the pid to signal (read at each notification).
        signal: The signal name, ``SIGHUP`` by default.
        timeout: Seconds allowed for the command or the POST.
    """

    command: tuple[str, ...] = ()
    url: str = ""
    pid: int | None = None
    pid_file: Path | None = None
    signal: str = "SIGHUP"
    timeout: float = 10.0

    @classmethod
    def from_options(cls, table: Mapping[str, Any], where: str) -> Notifier:
        """Read the ``notify`` options table.

        Raises:
            ConfigError: unknown keys, wrong types, an unknown signal or an ``http(s)`` URL missing.
        """
        opts = Options(table, where=where)
        command = tuple(opts.str_list("command"))
        url = opts.str("url", "")
        pid = opts.int("pid", None, minimum=2)  # 1 is init; 0 and negatives signal process groups
        pid_file = opts.path("pid_file")
        sig = opts.str("signal", "SIGHUP")
        timeout = opts.duration("timeout", 10.0)
        opts.finish()
        if sig not in signal.Signals.__members__:
            raise ConfigError(f"{where}: unknown signal {sig!r}")
        if url and not url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}: url must be http:// or https://, got {url!r}")
        if pid is not None and pid_file is not None:
            raise ConfigError(f"{where}: set pid or pid_file, not both")
        return cls(command, url, pid, pid_file, sig, timeout)

    @property
    def enabled(self) -> bool:
        """Whether any action is configured."""
        return bool(self.command or self.url or self.pid or self.pid_file)

    async def __call__(self, hosts: list[str], written: list[str], removed: list[str]) -> None:
        """Run every configured action.

        Raises:
            NotifyError: listing each action that failed.
        """
        failures = []
        if self.command:
            try:
                await self._run(hosts)
            except (OSError, NotifyError, TimeoutError) as exc:
                failures.append(f"command {self.command[0]}: {exc}")
        if self.url:
            body = json.dumps({"hosts": hosts, "written": written, "removed": removed}).encode()
            try:
                await asyncio.to_thread(self._post, body)
            except OSError as exc:
                failures.append(f"POST {self.url}: {exc}")
        if self.pid or self.pid_file:
            try:
                self._signal()
            except (OSError, ValueError, ReloaddError) as exc:
                failures.append(f"signal {self.signal}: {exc}")
        if failures:
            raise NotifyError("; ".join(failures))

    async def _run(self, hosts: list[str]) -> None:
        env = dict(os.environ, RELOADD_HOSTS=" ".join(hosts))
        try:
            res = await run_command(self.command, timeout=self.timeout, env=env, capture="stderr")
        except CommandError as exc:
            raise NotifyError(str(exc)) from None
        if not res.ok:
            tail = res.output.decode(errors="replace").strip()[-200:]
            raise NotifyError(f"exit status {res.returncode}: {tail}")

    def _post(self, body: bytes) -> None:
        req = urllib.request.Request(self.url, data=body, method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # scheme checked in from_options
            resp.read()

    def _signal(self) -> None:
        sig = signal.Signals[self.signal]
        if self.pid_file is not None:  # validated: a regular file, a live process, never 0/1/-1
            signal_pid_file(self.pid_file, sig, expect=None)
        elif self.pid is not None:
            os.kill(self.pid, sig)
