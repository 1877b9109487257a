"""The ``exec`` consumer: run a command for every batch, like watchexec or a systemd path unit.

Options (``[consumer.options]``):
    command: argv list, run without a shell.
    timeout: kill the command (and every process it started) after this long (default "5m").
    cwd: working directory (default: the config file's directory).

The batch is written to the command's stdin as one JSON object::

    {"consumer": "...", "reason": "inotify|rescan|startup|signal|trigger|drift",
     "changes": [{"path": "...", "kind": "added|modified|deleted", "size": 12, "mtime_ns": 1}]}

A zero exit acknowledges every path; a non-zero exit (or a timeout) fails the batch and
it is retried with backoff.

``reloadd plan`` lists the paths the command would be run for, but cannot say what it
would change: the consumer raises :class:`reloadd.PlanUnsupportedError`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reloadd import (
    Ack,
    BaseConsumer,
    Batch,
    CommandError,
    ConfigError,
    ConsumerContext,
    Options,
    Plan,
    PlanUnsupportedError,
    Result,
    Retry,
    result_of,
    run_command,
)

__all__ = ["ExecConsumer", "batch_json", "create"]


def batch_json(batch: Batch) -> dict[str, Any]:
    """The JSON document a command receives for ``batch``."""
    return {
        "consumer": batch.consumer,
        "reason": batch.reason.value,
        "changes": [
            {
                "path": str(c.path),
                "kind": c.kind.value,
                "size": c.fingerprint.size if c.fingerprint else None,
                "mtime_ns": c.fingerprint.mtime_ns if c.fingerprint else None,
            }
            for c in batch.changes
        ],
    }


class ExecConsumer(BaseConsumer):
    """Run ``command`` with each batch on stdin."""

    def __init__(self, ctx: ConsumerContext) -> None:
        super().__init__(ctx)
        opts = Options(ctx.options, where=f"consumer {ctx.name!r} options")
        self.command: list[str] = opts.str_list("command")
        if not self.command:
            raise ConfigError(f"consumer {ctx.name!r} options: 'command' must be a non-empty list")
        self.timeout: float = opts.duration("timeout", 300.0)
        base = ctx.config_file.parent if ctx.config_file else None
        self.cwd: Path | None = opts.path("cwd", base, base=base)
        opts.finish()
        self.stats: dict[str, float] = {"runs": 0, "failures": 0}

    async def plan(self, batch: Batch) -> Plan:
        """An arbitrary command's effects cannot be known without running it.

        Raises:
            PlanUnsupportedError: always.
        """
        raise PlanUnsupportedError(f"runs {self.command[0]}, whose effects cannot be known without running it")

    async def handle(self, batch: Batch) -> Mapping[Path, Result]:
        """Run the command once for the whole batch."""
        payload = json.dumps(batch_json(batch)).encode()
        self.stats["runs"] += 1
        env = {**os.environ, "RELOADD_CONSUMER": batch.consumer, "RELOADD_REASON": batch.reason.value}
        try:
            res = await run_command(self.command, timeout=self.timeout, stdin=payload, env=env, cwd=self.cwd)
        except CommandError as exc:
            self.stats["failures"] += 1
            return dict.fromkeys(batch.paths, result_of(exc, self.name, batch.paths[0]))  # the core's policy
        if not res.ok:
            self.stats["failures"] += 1
            return {p: Retry(res.describe()) for p in batch.paths}
        return {p: Ack() for p in batch.paths}


def create(ctx: ConsumerContext) -> ExecConsumer:
    """Entry point of the ``exec`` plugin."""
    return ExecConsumer(ctx)
