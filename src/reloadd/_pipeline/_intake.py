"""Intake and the pump: source events in, one task folding them into the aggregator turn after turn.

Sources hand events in (:meth:`Intake.emit`, :meth:`Intake.emit_all`, holding their reads back while settling
cannot keep up: :meth:`Intake.room`). One pump task takes them a turn at a time: file events go into the
aggregator (the hot path: a burst is 100,000 of them), structural ones become a forced pass or a rescan
(:class:`~reloadd._pipeline._rescans.Rescans`), and then what is due is settled
(:class:`~reloadd._pipeline._settle.Settling`). What the loop is doing and what settling waits for is one state,
:class:`~reloadd._pipeline._pump_state.PumpState`, changed only through its transitions.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from .._filters import under
from .._source import EventKind, SourceEvent
from .._types import Reason
from ._aggregator import Aggregator
from ._rescans import Force, Rescans
from ._slot import Slot

__all__ = ["Intake"]


class Intake(Rescans):
    """The engine's intake and pump (see the module's docstring), over its rescans and settling.

    Args:
        rescan_wait: Seconds a periodic rescan that falls due while paths are settling waits for them, at most
            (see :class:`~reloadd._pipeline._engine.Engine`).
    """

    def __init__(self, slots: Iterable[Slot], aggregator: Aggregator, clock: Callable[[], float],
                 on_change: Callable[[], None], full_rescan_every: int, rescan_wait: float) -> None:
        super().__init__(slots, aggregator, clock, on_change, full_rescan_every)
        self.inbox: asyncio.Queue[SourceEvent | Force | list[SourceEvent]] = asyncio.Queue()
        self.startup_done = asyncio.Event()
        self.rescan_wait = rescan_wait
        self._waiter: asyncio.Future[None] | None = None  # the pump waits on it for the next event
        self._timers: set[asyncio.TimerHandle] = set()  # drift corrections waiting out their backoff

    # Input -----------------------------------------------------------------------
    def emit(self, event: SourceEvent | Force) -> None:
        """Queue an event for the pump (callable from sources and signal handlers)."""
        self._put(event)
        if type(event) is SourceEvent and event.lost_at is not None:
            self.pump_state.lost(time.monotonic())
            self._stop_walk()
        self.on_change()

    def emit_all(self, events: list[SourceEvent]) -> None:
        """Queue several events for the pump in one step (a source's whole read)."""
        if events:
            self._handed_in += len(events)
            self._put(events)
            self.on_change()

    def _put(self, item: SourceEvent | Force | list[SourceEvent]) -> None:
        self.inbox.put_nowait(item)
        if self._waiter is not None:
            _wake(self._waiter)  # the pump runs in the next turn of the loop

    async def room(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for room for more events; whether there is.

        There is none while more paths are due than a settling step takes and over :data:`_BACKLOG` are
        settling or handed in. A source that reads faster than paths settle (a writer at full speed, 70,000
        files a second) then keeps what it read as it read it, a few dozen bytes a path, instead of handing
        it all over at once: each path handed in is a few hundred bytes of objects until it settles, and a
        burst's peak of them stayed behind as fragmented memory (pymalloc keeps an arena while one object
        in it lives). A 100,000-path modify burst had up to ~75,000 paths settling at once and its process
        held +19 % 30 s later; with the reads held back, ~17,000 at most and -4 % (``python -m bench``).
        No path settles later for it: the settling steps are full all along. While a source waits, every
        consumer :meth:`holds` (what it read may be anyone's).

        Nor is there room while :data:`_BACKLOG` events are handed in and not taken by the pump yet, however
        the last step went: a source parsing the reads it kept one after another, without a turn of the pump
        between them, handed ~74,000 events of a modify burst in at once (the same peak, +20 % 30 s later).
        """
        if self._has_room():
            return True
        self._room.clear()
        self.stats.reads_held += 1
        self.pump_state.hold_reads()
        try:
            await asyncio.wait_for(self._room.wait(), timeout)
        except TimeoutError:
            return False
        finally:
            self.pump_state.reads_go_on()
        return True

    # The pump --------------------------------------------------------------------
    async def pump(self) -> None:
        """Process events and settle paths until cancelled."""
        self.pump_state.restart()
        try:
            await self._pump()
        finally:
            for timer in self._timers:
                timer.cancel()
            self._timers.clear()

    async def _pump(self) -> None:
        state = self.pump_state
        while True:
            ready = self._take_due_findings()
            deadline = self.agg.next_deadline()
            if ready is not None:  # more findings wait: the pump comes back for them then
                deadline = ready if deadline is None else min(deadline, ready)
            timeout = (None if deadline is None
                       else max(0.0, deadline - self.clock(), state.cadence(time.monotonic())))
            events: list[SourceEvent | Force] = []
            left = state.rescan_left(time.monotonic(), self.rescan_wait)
            if left is not None:  # a periodic rescan waits for the paths settling: its turn once they are in
                if left <= 0.0 or not self._settling_now():
                    events.append(_TICK)
                else:
                    timeout = left if timeout is None else min(timeout, left)
            if self.inbox.empty() and not events:
                if timeout == 0.0:
                    await asyncio.sleep(0)  # something is due now: still one turn for every other task
                else:
                    await self._arrival(timeout)
            while not self.inbox.empty():
                _take(events, self.inbox.get_nowait())
            self._handed_in = 0
            if self._has_room():
                self._room.set()  # as after a settling step: a source held back by what it handed in goes on
            state.take()  # any loss queued so far is in ``events``
            try:
                if events:
                    await self._process(events)
                # Events lost while that ran: their rescan goes first, settling waits one turn (not two).
                if state.settles() and state.cadence(time.monotonic()) == 0.0:
                    await self._settle_due()
            finally:
                state.done()
                self.on_change()

    def _rescan_later(self) -> bool:
        """A periodic rescan is due: whether it waits for the paths settling now (see ``rescan_wait``)."""
        state = self.pump_state
        first = state.rescan_since is None
        if state.rescan_due(time.monotonic(), self.rescan_wait, self.rescan_wait > 0.0 and self._settling_now()):
            if first:
                self.stats.rescans_waited += 1
            return True
        return False

    async def _arrival(self, timeout: float | None) -> None:
        """Wait until an event is queued, or ``timeout`` seconds.

        An event wakes the pump in the next turn of the loop (``asyncio.wait_for`` on ``Queue.get`` takes
        three turns, and in a storm every other task's work runs in each of them).
        """
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout, _wake, waiter) if timeout is not None else None
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    async def _process(self, events: list[SourceEvent | Force]) -> None:
        now = self.clock()
        subtrees: set[Path] = set()
        rescan: Reason | None = None
        periodic = True  # every RESCAN asked for is the timer's (none says events were lost)
        lost_at: float | None = None  # the earliest loss of events a RESCAN here is for
        everything: Reason | None = None  # a forced pass of every consumer's every path, asked for by ...
        whole: dict[str, Reason] = {}  # ... or of one consumer's
        seen: Counter[tuple[str, EventKind]] = Counter()
        watchers = self._watchers()
        for ev in events:
            if type(ev) is SourceEvent and ev.kind in _FILE_KINDS and ev.path is not None:
                seen[(ev.source, ev.kind)] += 1  # the hot path: a file event (100k in a burst)
                self._observe_file(ev, now, watchers)
                continue
            if isinstance(ev, SourceEvent) and ev.kind is EventKind.RESYNC:
                ev = Force(reason=Reason.SIGNAL)  # SIGHUP: an operator asked
            if isinstance(ev, Force):
                if ev.paths is not None:
                    self._force(ev, now)
                elif ev.consumer is None:
                    everything = everything or ev.reason
                elif ev.consumer in self.slots:
                    whole.setdefault(ev.consumer, ev.reason)
                continue
            if ev is not _TICK:
                seen[(ev.source, ev.kind)] += 1
            if ev.kind is EventKind.RESCAN:
                if ev.source in ("inotify", "supervisor"):  # events were lost
                    self.stats.overflows += ev.source == "inotify"
                    self.agg.distrust_writers(now)
                if type(ev) is SourceEvent and ev.lost_at is not None:
                    lost_at = ev.lost_at if lost_at is None else min(lost_at, ev.lost_at)
                periodic = periodic and ev.source == "rescan"
                if rescan is not Reason.STARTUP:
                    rescan = Reason.STARTUP if ev.source == "startup" else Reason.RESCAN
            elif ev.kind is EventKind.SUBTREE and ev.path is not None:
                subtrees.add(Path(ev.path))
            elif ev.kind is EventKind.DRIFTED and ev.path is not None:
                self._drifted(ev, now)
            elif ev.path is not None:
                self._observe_file(ev, now, watchers)
        for (source, kind), n in seen.items():
            self.stats.events[(source, kind.value)] += n
        if lost_at is not None:  # the rescan of every root starts below, at once
            self.stats.recovery_delays.append(max(0.0, time.monotonic() - lost_at))
        if everything is not None or (rescan is not None and not periodic):
            self.pump_state.rescan_ran()  # a walk of every root runs now: a periodic one waiting is done with it
        if everything is not None:
            self.stats.resyncs += 1
            await self.reconcile(None, everything, forced=True)
        elif rescan is not None:
            if not (rescan is Reason.RESCAN and periodic and self._rescan_later()):
                await self.reconcile(None, rescan, periodic=periodic)
        elif subtrees:
            tops = [p for p in subtrees if not any(q != p and under(p, q) for q in subtrees)]
            await self.reconcile(tops, Reason.INOTIFY)
        if everything is None:
            for name, why in sorted(whole.items()):
                await self.reconcile(None, why, forced=True, only=name)
        if rescan is Reason.STARTUP:
            self.startup_done.set()

    def _watchers(self) -> list[tuple[str, Mapping[str, bytes], Callable[[str, Path | None], bool]]]:
        """Each consumer as a file event asks it (:meth:`_observe_file`): its name, its records and its filter,
        looked up once per turn of the pump, not through two properties per event and consumer."""
        return [(slot.name, slot.records.packed, slot.owns) for slot in self.slots.values()]

    def _observe_file(self, ev: SourceEvent, now: float,
                      watchers: list[tuple[str, Mapping[str, bytes], Callable[[str, Path | None], bool]]]) -> None:
        path = ev.path
        assert path is not None
        kind = ev.kind
        if type(path) is str:
            key, obj = path, None
        else:
            key, obj = os.fspath(path), path if isinstance(path, Path) else None
        for name, packed, owns in watchers:
            if key in packed or owns(key, obj):  # a recorded path is the consumer's
                self.agg.observe((name, key), now, reason=_INOTIFY, writing=_WRITING.get(kind),
                                 arrived=kind is _ARRIVED)
                self.agg.coalesced += ev.folded  # folded by the source: coalesced all the same

    def _drifted(self, ev: SourceEvent, now: float) -> None:
        """A far-side source saw what a file declared drift: correct it now, later (a fight), or only note it."""
        assert ev.path is not None
        key = os.fspath(ev.path)
        slots = [self.slots[ev.consumer]] if ev.consumer in self.slots else list(self.slots.values())
        for s in slots:
            if not (key in s.records.by_str or s.owns(key)):
                continue
            delay = s.drift.saw(key, ev.drift)
            if delay is None:
                continue
            force = Force(s.name, (Path(key),), Reason.DRIFT)
            if delay <= 0:
                self._force(force, now)
                continue
            self._later(delay, force)

    def _later(self, delay: float, force: Force) -> None:
        """Emit ``force`` in ``delay`` seconds (unless the pump stops first)."""
        handle: list[asyncio.TimerHandle] = []

        def fire() -> None:
            self._timers.discard(handle[0])
            self.emit(force)

        handle.append(asyncio.get_running_loop().call_later(delay, fire))
        self._timers.add(handle[0])


_ARRIVED, _INOTIFY = EventKind.ARRIVED, Reason.INOTIFY  # an enum member read as a class attribute costs ~0.1 µs
_WRITING = {EventKind.WRITING: True, EventKind.WRITTEN: False, EventKind.ARRIVED: False, EventKind.GONE: False}
_FILE_KINDS = frozenset(EventKind) - {EventKind.RESCAN, EventKind.SUBTREE, EventKind.DRIFTED, EventKind.RESYNC}
_TICK = SourceEvent(EventKind.RESCAN, None, "rescan")  # a periodic rescan that waited, its turn come (counted once)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _take(events: list[SourceEvent | Force], got: SourceEvent | Force | list[SourceEvent]) -> None:
    if isinstance(got, list):
        events.extend(got)  # a source's whole read, emitted in one step
    else:
        events.append(got)
