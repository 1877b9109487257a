"""The periodic rescan: every ``rescan_interval`` ask the engine to re-examine every root.

The walk itself (a stat walk diffed against what each consumer acknowledged) runs in the
engine, off the event loop; this source is only the clock, idle between ticks.
"""

from __future__ import annotations

import asyncio

from .._source import EventKind, SourceContext, SourceEvent

__all__ = ["RescanSource"]


class RescanSource:
    """Emit :attr:`EventKind.RESCAN` every ``ctx.rescan_interval`` seconds."""

    name = "rescan"

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx

    async def run(self) -> None:
        """Tick until cancelled (never, when the interval is 0)."""
        interval = self.ctx.rescan_interval
        if interval <= 0:
            await asyncio.Event().wait()
        while True:
            await asyncio.sleep(interval)
            self.ctx.emit(SourceEvent(EventKind.RESCAN, None, self.name))
