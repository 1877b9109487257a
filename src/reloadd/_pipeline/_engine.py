"""The engine core: source events in, settled items out to each consumer's queue.

One pump task owns the aggregator. It folds every event into it, probes keys once they
are due (a stat, off the loop when many), computes content digests for consumers that
want them, and puts released paths on the owning consumer's :class:`~reloadd._pipeline._queue.WorkQueue`.
Structural events (a new or moved directory, a ConfigMap swap, a periodic or overflow
rescan, a forced resync) become a *reconcile*: a stat walk compared against what each
consumer acknowledged, so only what differs enters the aggregator, a settling step's worth at a time (the
walk's own table holds the rest: a 100,000-path pass is never 100,000 aggregator entries at once).

Inside the engine a path is its string (aggregator keys, filter memo, records, queue
keys): one object per path, hashed and compared in C. A ``Path`` is built once per
hand-over, for the consumer.

The engine is three parts, one module each, stacked so that each calls only itself and what is below it
(:class:`Engine` is their composition, with what the facade reads of the whole):

* intake and the pump (:mod:`reloadd._pipeline._intake`): events in, a turn at a time; the pump's state is
  :class:`~reloadd._pipeline._pump_state.PumpState`, changed only through its transitions;
* forced passes and rescans (:mod:`reloadd._pipeline._rescans`): the walk, its findings, forced paths;
* settling and hand-over (:mod:`reloadd._pipeline._settle`): probes, digests, removals judged, queues fed.

Each part keeps its own state (set up in its ``__init__``); one object, so a hot path reads its attributes as
before (no extra object, call or await per event).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from ._aggregator import Aggregator
from ._intake import Intake
from ._item import forget_parts
from ._pump_state import Doing
from ._rescans import Force
from ._slot import Slot
from ._stats import EngineStats

__all__ = ["Engine", "EngineStats", "Force", "Slot"]


class Engine(Intake):
    """Own the aggregator and feed the consumers' queues.

    Args:
        slots: The consumers.
        aggregator: The aggregator (timings per consumer already set).
        clock: Monotonic clock.
        on_change: Called after every step (idle tracking).
        full_rescan_every: Periodic rescans over which every file is stat-ed once: each
            stats what :attr:`coverage` does not vouch for, plus the files of this share of
            the directories it does (1: every rescan stats every file).
        rescan_wait: Seconds a periodic rescan (the timer's, not one for lost events) that falls due while
            paths are settling waits for them to be handed over, at most (0: it never waits). The watch is
            delivering them; a walk in the middle of a burst meets a tree in flux, and judges gone every
            file removed whose event is still among the reads held back (:meth:`room`): a delete burst of
            100,000 files with a walk in it peaked at 141 MiB and took 5.6-5.9 s of CPU, ~95 MiB and
            2.3-2.4 s without one.
    """

    def __init__(
        self,
        slots: Iterable[Slot],
        aggregator: Aggregator,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] = lambda: None,
        full_rescan_every: int = 1,
        rescan_wait: float = 0.0,
    ) -> None:
        super().__init__(slots, aggregator, clock, on_change, full_rescan_every, rescan_wait)

    @property
    def busy(self) -> bool:
        """The pump is acting on events it took, or settling (see :class:`~reloadd._pipeline._pump_state.Doing`)."""
        return self.pump_state.doing is Doing.WORKING

    def release_caches(self) -> None:
        """Drop what only speeds up a burst (content digests, memoised filter verdicts, directories' parts): it is over.

        Called when idle (no walk or judgement reads the records in a thread): a record table a mass
        removal emptied is rebuilt smaller too.
        """
        self.digests.clear()
        forget_parts()
        for slot in self.slots.values():
            slot._owns = {}
            slot.records.shrink()

    @property
    def idle(self) -> bool:
        """No event waiting, nothing held, nothing being worked on."""
        return (
            self.inbox.empty()
            and not self.busy
            and len(self.agg) == 0
            and not self._found
            and self.pump_state.rescan_since is None
            and all(s.queue.idle for s in self.slots.values())
        )
