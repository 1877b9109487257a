"""Keep one source (or the pump) running: rebuild it after any failure, under a tenacity retry.

A failure means events may have been lost, so every rebuild is preceded by a rescan
request. Hitting the inotify watch limit is persistent: it is reported once, the watch
is marked degraded, and the rebuild is tried only every minute while rescans cover the gap.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from typing import Any, Protocol

import tenacity

from .._backoff import Backoff
from .._errors import WatchLimitError

__all__ = ["Runnable", "supervise"]

log = logging.getLogger("reloadd")

LIMIT_RETRY = 60.0
"""Seconds between rebuilds while the watch limit is hit."""
MAX_BACKOFF = 30.0
_BACKOFF = Backoff(0.1, MAX_BACKOFF, jitter=False)  # 0.1 s doubled: a source rebuilt at once, then calmer


class Runnable(Protocol):
    """A source or the pump: something with ``async run()``."""

    async def run(self) -> None: ...


async def supervise(
    name: str,
    build: Callable[[], Runnable],
    *,
    live: MutableMapping[str, Any],
    on_limit: Callable[[WatchLimitError, bool], None],
    rescan: Callable[[], None],
) -> None:
    """Run ``build()``'s result until it returns; rebuild it whenever it raises.

    Args:
        name: For logs and ``live``.
        build: Makes a fresh instance.
        live: Holds the running instance under ``name`` while it runs.
        on_limit: Called with the watch-limit error and whether it is the first in a row.
        rescan: Asks for a full rescan (events may have been lost).
    """
    limited = False

    def wait(rs: tenacity.RetryCallState) -> float:
        exc = rs.outcome.exception() if rs.outcome else None
        if isinstance(exc, WatchLimitError):
            return LIMIT_RETRY  # persistent: do not spin, rescans cover the gap
        return _BACKOFF.delay(rs.attempt_number)

    def before_sleep(rs: tenacity.RetryCallState) -> None:
        nonlocal limited
        exc = rs.outcome.exception() if rs.outcome else None
        if isinstance(exc, WatchLimitError):
            on_limit(exc, not limited)
            limited = True
        else:
            limited = False
            log.error("Source %s failed, rebuilding the watch: %s", name, exc, exc_info=exc)
        rescan()

    retrying = tenacity.AsyncRetrying(
        wait=wait,
        retry=tenacity.retry_if_exception_type(Exception),
        before_sleep=before_sleep,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            instance = build()
            live[name] = instance
            try:
                await instance.run()
            finally:
                live.pop(name, None)
            return
