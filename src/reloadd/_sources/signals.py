"""SIGHUP as a forced resync, chained to the host's handler and restored on close.

uvicorn's lesson: a library embedded in another daemon must not hijack its signals. The
handler only *records* (asks the loop, thread-safely, to emit one resync event) and then
calls whatever Python-level handler was installed before it, so the host keeps seeing
its SIGHUP. A host that registered its handler with ``loop.add_signal_handler`` keeps
it too: the loop learns of signals through its wake-up fd, which the C-level signal
handler writes whichever Python handler is installed — no asyncio internals are read.

On stop the previous handler is put back only if ours is still the installed one: a
host that installed its own handler meanwhile keeps it, never overwritten by a stale one.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

from .._source import EventKind, SourceContext, SourceEvent

__all__ = ["SignalSource"]

_Handler = Callable[[int, FrameType | None], Any]


class SignalSource:
    """Turn SIGHUP into :attr:`EventKind.RESYNC` while running, chaining to the previous handler."""

    name = "signal"
    signals = (signal.SIGHUP,)

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx
        self._pending = False

    async def run(self) -> None:
        """Install the handler, wait until cancelled, then restore the previous one."""
        loop = asyncio.get_running_loop()
        previous: dict[int, _Handler | int | None] = {}

        def handler(signum: int, frame: FrameType | None) -> None:
            if not self._pending:  # a burst of signals becomes one resync
                self._pending = True
                loop.call_soon_threadsafe(self._fire)
            prev = previous.get(signum)
            if callable(prev):
                prev(signum, frame)

        try:
            for sig in self.signals:
                previous[sig] = signal.signal(sig, handler)
            await asyncio.Event().wait()
        finally:
            for signum, prev in previous.items():
                if signal.getsignal(signum) is not handler:
                    self.ctx.logger.debug("Leaving the handler of signal %d alone: replaced since", signum)
                    continue
                signal.signal(signum, prev if prev is not None else signal.SIG_DFL)

    def _fire(self) -> None:
        self._pending = False
        self.ctx.logger.info("Received SIGHUP: resyncing every consumer")
        self.ctx.emit(SourceEvent(EventKind.RESYNC, None, self.name))
