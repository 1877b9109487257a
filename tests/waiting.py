"""The one wait the tests poll with: for state of another process (a daemon, containerd, the API server)
that offers nothing of ours to await. Something of ours to await (a Recorder's condition, an event) is
awaited instead."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

__all__ = ["until"]


async def until(check: Callable[[], bool | Awaitable[bool]], *, what: str = "", timeout: float = 30.0,
                thread: bool = False, every: float = 0.05) -> float:
    """Poll ``check`` (plain or async) until it holds; the seconds it took.

    Args:
        check: The condition; a coroutine function is awaited.
        what: Named in the failure.
        timeout: Seconds before the test fails.
        thread: Run a blocking ``check`` (a subprocess, an API request) in a worker thread.
        every: Seconds between polls.

    Raises:
        AssertionError: ``check`` did not hold within ``timeout``.
    """
    start = time.monotonic()
    while True:
        got = await asyncio.to_thread(check) if thread else check()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        await asyncio.sleep(every)
