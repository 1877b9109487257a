"""Writes that run beside the walk of a tarball, a bounded number at once (see ``_ingest``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["Beside"]

T = TypeVar("T")


class Beside(Generic[T]):
    """Writes run beside the reading and streaming of the members after them, at most ``slots`` at once.

    A failed write's error comes out at the next :meth:`start`, :meth:`check` or :meth:`finish`;
    :meth:`close` cancels what still runs and waits for it.
    """

    def __init__(self, slots: int) -> None:
        self._slots = asyncio.Semaphore(slots)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, write: Callable[[], Awaitable[T]], done: Callable[[T], None]) -> None:
        """Run ``write()`` beside the caller (once a slot is free); ``done`` gets its result."""
        self.check()
        await self._slots.acquire()

        async def run() -> None:
            try:
                done(await write())
            finally:
                self._slots.release()

        self._tasks.append(asyncio.create_task(run()))

    def check(self) -> None:
        """Raise the error of a write that failed; forget those that ended."""
        for t in self._tasks:
            if t.done() and not t.cancelled() and (exc := t.exception()) is not None:
                raise exc
        self._tasks = [t for t in self._tasks if not t.done()]

    async def finish(self) -> None:
        """Wait for every write; raise the first error."""
        while self._tasks:
            await asyncio.wait(self._tasks, return_when=asyncio.FIRST_EXCEPTION)
            self.check()

    async def close(self) -> None:
        """Cancel the writes still running and wait for them."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
