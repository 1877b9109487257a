"""SIGHUP as a forced resync, installed so that the previous handler comes back on close.

uvicorn's lesson: a library embedded in another daemon must not hijack its signals. The
handler only *records* (emits an event); the engine acts on it in its own time. Whatever
handled SIGHUP before — a plain ``signal.signal`` handler or the embedder's own
``loop.add_signal_handler`` callback — is put back when the source stops.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from .base import EventKind, SourceContext, SourceEvent

__all__ = ["SignalSource"]


class SignalSource:
    """Turn SIGHUP into :attr:`EventKind.RESYNC` while running."""

    name = "signal"
    signals = (signal.SIGHUP,)

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx

    async def run(self) -> None:
        """Install the handler, wait until cancelled, then restore the previous one."""
        loop = asyncio.get_running_loop()
        # asyncio keeps its callbacks in a private map; read it defensively, only to restore.
        loop_handlers: dict[int, Any] = getattr(loop, "_signal_handlers", {})
        previous: dict[int, tuple[Any, Any]] = {}
        try:
            for sig in self.signals:
                previous[sig] = (signal.getsignal(sig), loop_handlers.get(sig))
                loop.add_signal_handler(sig, self._fire)
            # A burst of signals may fill asyncio's wake-up socket; the dropped bytes are
            # only duplicates of a resync already queued, so do not warn about them.
            fd = signal.set_wakeup_fd(-1)
            signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
            await asyncio.Event().wait()
        finally:
            for signum, (handler, callback) in previous.items():
                loop.remove_signal_handler(signum)
                if callback is not None:  # the embedder's own asyncio handler
                    loop.add_signal_handler(signum, callback._callback, *callback._args)
                else:
                    signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def _fire(self) -> None:
        self.ctx.logger.info("Received SIGHUP: resyncing every consumer")
        self.ctx.emit(SourceEvent(EventKind.RESYNC, None, self.name))
