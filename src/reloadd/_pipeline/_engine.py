"""The engine core: source events in, settled items out to each consumer's queue.

One pump task owns the aggregator. It folds every event into it, probes keys once they
are due (a stat, off the loop when many), computes content digests for consumers that
want them, and puts released paths on the owning consumer's :class:`WorkQueue`.
Structural events (a new or moved directory, a ConfigMap swap, a periodic or overflow
rescan, a forced resync) become a *reconcile*: a stat walk compared against what each
consumer acknowledged, so only what differs enters the aggregator, a settling step's worth at a time (the
walk's own table holds the rest: a 100,000-path pass is never 100,000 aggregator entries at once).

Inside the engine a path is its string (aggregator keys, filter memo, records, queue
keys): one object per path, hashed and compared in C. A ``Path`` is built once per
hand-over, for the consumer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .._consumer import BaseConsumer, Consumer
from .._filters import PathFilter, under
from .._source import Coverage, EventKind, SourceEvent
from .._state._records import RecordStore
from .._types import Fingerprint, Reason
from ._aggregator import Aggregator, Key, Pending
from ._changes import CHANGED, UNREADABLE, Diff, Recorded, Resume, View, diff, digest_all, probe_all, steady
from ._drift import DriftBook
from ._item import forget_parts, path_of
from ._queue import Item, WorkQueue
from ._scan import DigestCache, Listing
from ._writers import writers_of

__all__ = ["Engine", "EngineStats", "Force", "Slot"]

log = logging.getLogger("reloadd.engine")

_ON_LOOP = 1024  # a settling step of up to this many paths the watch reported is probed and read on the loop
_OFFLOAD = 64  # a step of more paths than this, any a walk found, is probed in a worker thread
_SMALL = 16 * 1024  # bytes: a file the watch reported up to this size may be read for its digest on the loop
_STEP = 1024  # keys of a walk's findings taken in, and settled, per turn at least (see Engine._feed)
_FEED_MAX = 4096  # keys settled per turn at most (a fast consumer's backlog: see Engine._feed)
_OWNS_CACHE = 1 << 15  # memoised filter verdicts; recorded paths never need one
_STORM_STEP = 256  # keys settled per turn then (a step's digests take ~15 ms, not ~60)
_STORM = 2.0  # seconds after a loss of events during which settling goes in the smallest steps (see Engine._feed)
_CADENCE = 0.02  # seconds at least between settling steps that each took all that was due (a trickle; see _pump)
_FLOW = 0.05  # seconds between looks at what a running walk found so far (see Engine._while_walking)
_STOP_FOR = 60.0  # seconds walks of every root may keep being stopped for newer losses (then one runs to its end)
_BACKLOG = 8192  # paths settling (or handed in, not taken yet) beyond which a source holds its reads back (see room)


@dataclass
class Slot:
    """A consumer as the engine holds it."""

    consumer: Consumer
    filter: PathFilter
    records: RecordStore
    queue: WorkQueue
    drift: DriftBook = field(default=None)  # type: ignore[assignment]  # set in __post_init__ when not given

    @property
    def name(self) -> str:
        """The consumer's name."""
        return self.consumer.name

    def __post_init__(self) -> None:
        if self.drift is None:
            self.drift = DriftBook(self.consumer.name)
        self._owns: dict[str, bool] = {}
        self._bad_accepts: set[str] = set()
        # Not overridden: no Path to build per event.
        self._accepts_all = type(self.consumer).accepts is BaseConsumer.accepts

    def owns(self, key: str, path: Path | None = None) -> bool:
        """Whether the path ``key`` is this consumer's business (the path filter is memoised).

        ``path`` is the same path as a ``Path`` when the caller has one (else one is built).
        """
        hit = self._owns.get(key)
        if hit is None:
            if len(self._owns) >= _OWNS_CACHE:
                self._owns.clear()
            hit = self._owns[key] = self.filter.matches(key)
        if not hit:
            return False
        if self._accepts_all:
            return True
        try:
            return bool(self.consumer.accepts(path if path is not None else path_of(key)))  # no name interned
        except Exception as exc:  # a plugin bug must not stop the pump for everyone
            if key not in self._bad_accepts:
                self._bad_accepts.add(key)
                log.error("Failed to filter %s in consumer %s: %s", key, self.name, exc)
            return False


@dataclass(slots=True)
class _Findings:
    """What one walk found for one consumer, taken into the aggregator a settling step's worth at a time.

    A 100,000-path start-up pass or overflow rescan is held as the walk's own table (path -> its stat,
    packed), not as 100,000 aggregator entries at once: an entry is made for a path shortly before it is
    probed, and the memory a whole pass of entries took (and left fragmented) is never taken.
    """

    name: str
    seen: dict[str, object]  # path -> the walk's stat (see Diff.observe); read, never changed
    when: float  # the walk's end: every stat in it was taken before (the quiet period runs from then)
    reason: Reason
    forced: bool
    at: int = 0  # how many of ``seen`` (in its order) are taken in
    rest: Iterator[str] = field(init=False)  # ``seen``'s paths from ``at`` on

    def __post_init__(self) -> None:
        self.rest = iter(self.seen)

    @property
    def left(self) -> int:
        """Paths still to be taken in."""
        return len(self.seen) - self.at


@dataclass(frozen=True)
class Force:
    """A forced pass: hand paths over again, all of a consumer's (``paths=None``), some, or everyone's.

    The one name for it inside the core: SIGHUP (the signal source's ``RESYNC``), ``reloadd reload``,
    ``Reloader.trigger()``, a consumer's ``ctx.trigger`` and a drift correction all become one.
    ``reason`` says who asked (``SIGNAL``: an operator; ``TRIGGER``: the consumer itself; ``DRIFT``:
    a far-side source, see :class:`~reloadd._pipeline._drift.DriftBook`).
    """

    consumer: str | None = None
    paths: tuple[Path, ...] | None = None
    reason: Reason = Reason.SIGNAL


@dataclass
class EngineStats:
    """Counters a metrics exporter reads."""

    events: Counter[tuple[str, str]] = field(default_factory=Counter)
    overflows: int = 0
    rescans: int = 0
    rescan_seconds: float = 0.0
    covered_rescans: int = 0
    """Periodic rescans that took live watches on trust (a share of :attr:`rescans`)."""
    resyncs: int = 0
    handed_over: int = 0
    recovery_delays: deque[float] = field(default_factory=lambda: deque(maxlen=4096))
    """Seconds from a loss of events (an inotify overflow) to the start of its rescan, for each of the latest
    (a benchmark reads them all)."""
    restarted_rescans: int = 0
    """Walks of every root stopped part-way for a newer loss of events, whose rescan started at once."""
    reads_held: int = 0
    """Times a source held its reads back, unparsed, while more paths were due than settling takes (see
    :meth:`Engine.room`)."""
    rescans_waited: int = 0
    """Periodic rescans that fell due while paths were settling and waited for them (see ``rescan_wait``)."""

    @property
    def recovery_delay(self) -> float | None:
        """Seconds from the last loss of events to the start of its rescan (``None``: none yet)."""
        return self.recovery_delays[-1] if self.recovery_delays else None


class Engine:
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
        self.slots = {s.name: s for s in slots}
        self.agg = aggregator
        self.clock = clock
        self.on_change = on_change
        self.inbox: asyncio.Queue[SourceEvent | Force | list[SourceEvent]] = asyncio.Queue()
        self.digests = DigestCache()
        self.stats = EngineStats()
        self.busy = False
        self.startup_done = asyncio.Event()
        self._warned: dict[str, str] = {}
        self._in_hand: set[Key] = set()  # released by the aggregator, not yet on a queue
        self._in_hand_by: Counter[str] = Counter()
        self.coverage = Coverage()
        """Directories the sources report every change in (given to them in their context)."""
        self.full_rescan_every = max(1, full_rescan_every)
        self._tick = 0  # periodic rescans so far: which share of the covered directories the next one stats
        self._trusted: dict[str, int] | None = None  # the coverage as the last rescan of every root began
        self._listings: dict[str, Listing] = {}  # covered directories as a periodic rescan listed them
        self._recorded: dict[str, Recorded] = {}  # each consumer's recorded paths as the last walk took them
        self._loss_waiting = False  # a source's loss of events is queued: its rescan goes before settling
        self._waiter: asyncio.Future[None] | None = None  # the pump waits on it for the next event
        self._walk_stop: threading.Event | None = None  # set to stop the walk of every root running now
        self._stopping_since: float | None = None  # the first of the walks stopped in a row (see _STOP_FOR)
        self._resume: Resume | None = None  # where the last walk of every root was stopped
        self._settled_at = 0.0  # time.monotonic() of the latest settling step that handed something over
        self._drained = False  # that step took everything due at its time (see _cadence)
        self._lost = -_STORM  # time.monotonic() of the latest loss of events a source reported
        self._walking: Counter[str] = Counter()  # consumers under a walk running now
        self._timers: set[asyncio.TimerHandle] = set()  # drift corrections waiting out their backoff
        self._found: deque[_Findings] = deque()  # walks' findings not yet taken into the aggregator
        self._room = asyncio.Event()  # set: a source may hand more events in (see room)
        self._room.set()
        self._backlog = False  # the last settling step was cut short by its size: more was due than it takes
        self._handed_in = 0  # events handed in by emit_all and not taken by the pump yet
        self._holding_reads = 0  # sources waiting in room() now, with events read and not looked at
        self.rescan_wait = rescan_wait
        self._rescan_since: float | None = None  # time.monotonic() a periodic rescan began waiting (see rescan_wait)

    # Input -----------------------------------------------------------------------
    def emit(self, event: SourceEvent | Force) -> None:
        """Queue an event for the pump (callable from sources and signal handlers)."""
        self._put(event)
        if type(event) is SourceEvent and event.lost_at is not None:
            self._loss_waiting = True
            self._lost = time.monotonic()
            since = self._stopping_since
            if self._walk_stop is not None and (since is None or time.monotonic() - since < _STOP_FOR):
                # A walk running now may have passed where events were just lost: it stops at its next
                # directory (what it met is kept) and the new loss's walk starts at once, going on where
                # that one stopped, then walking again what it had walked.
                self._walk_stop.set()
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
        self._holding_reads += 1
        try:
            await asyncio.wait_for(self._room.wait(), timeout)
        except TimeoutError:
            return False
        finally:
            self._holding_reads -= 1
        return True

    def _has_room(self) -> bool:
        if self._handed_in >= _BACKLOG:
            return False  # a source parsed read after read without a turn of the pump: let it take them first
        return not self._backlog or len(self.agg) + self._handed_in < _BACKLOG

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
            and self._rescan_since is None
            and all(s.queue.idle for s in self.slots.values())
        )

    @property
    def settling_total(self) -> int:
        """Paths settling: held in the aggregator, or found by a walk and waiting to be (see :class:`_Findings`)."""
        return len(self.agg) + sum(f.left for f in self._found)

    def settling(self, consumer: str) -> int:
        """Paths of ``consumer`` settling (as :attr:`settling_total` counts them)."""
        return self.agg.count(consumer) + self._found_left(consumer)

    def _found_left(self, consumer: str) -> int:
        """Paths of ``consumer`` found by walks and not taken into the aggregator yet."""
        return sum(f.left for f in self._found if f.name == consumer)

    def holds(self, consumer: str) -> bool:
        """Whether paths of ``consumer`` are settling (for less than its ``max_delay``) or being handed over.

        What ``after`` waits for: a path held longer (a log kept open, a file that keeps growing)
        no longer holds other consumers back; it stays listed in status as held.
        """
        return (self._in_hand_by[consumer] > 0 or self._walking[consumer] > 0 or self._holding_reads > 0
                or self._found_left(consumer) > 0 or self.agg.holds_fresh(consumer, self.clock()))

    def holds_any(self, consumer: str, paths: Callable[[Path], bool]) -> bool:
        """Whether a path of ``consumer`` for which ``paths`` is true is settling (as :meth:`holds` counts)."""
        if not self.holds(consumer):
            return False
        if self._walking[consumer] > 0 or self._holding_reads > 0:
            return True  # a walk under way, or reads held back, may hold such a path: not known until looked at
        if any(k[0] == consumer and paths(Path(k[1])) for k in self._in_hand):
            return True
        for f in self._found:
            if f.name != consumer:
                continue
            if f.left > _FEED_MAX:
                return True  # a big walk's findings still to come (taken in within seconds): not looked through
            if any(paths(Path(k)) for k in itertools.islice(f.seen, f.at, None)):
                return True
        limit = self.clock() - self.agg.timing(consumer).max_delay
        for key in self.agg.keys():
            p = self.agg.get(key)
            if key[0] == consumer and p is not None and p.first > limit and paths(Path(key[1])):
                return True
        return False

    def held_long(self, consumer: str) -> list[tuple[str, str, float]]:
        """Paths of ``consumer`` settling for longer than its ``max_delay``: (path, why, seconds held), oldest first."""
        now = self.clock()
        out = []
        for key, p in self.agg.overdue(consumer, now):
            why = "open for writing" if p.writing else "still growing" if p.verify else "still changing"
            out.append((key, why, now - p.first))
        return out

    # The pump --------------------------------------------------------------------
    async def pump(self) -> None:
        """Process events and settle paths until cancelled."""
        try:
            await self._pump()
        finally:
            for timer in self._timers:
                timer.cancel()
            self._timers.clear()

    async def _pump(self) -> None:
        deferred = False  # the last turn put settling off for a rescan: the next one settles whatever comes
        while True:
            ready = self._take_due_findings()
            deadline = self.agg.next_deadline()
            if ready is not None:  # more findings wait: the pump comes back for them then
                deadline = ready if deadline is None else min(deadline, ready)
            timeout = None if deadline is None else max(0.0, deadline - self.clock(), self._cadence())
            events: list[SourceEvent | Force] = []
            since = self._rescan_since
            if since is not None:  # a periodic rescan waits for the paths settling: its turn once they are in
                left = since + self.rescan_wait - time.monotonic()
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
            self._loss_waiting = False  # any loss queued so far is in ``events``
            self.busy = True
            try:
                if events:
                    await self._process(events)
                # Events lost while that ran: their rescan goes first, settling waits one turn (not two).
                deferred = self._loss_waiting and not deferred
                if not deferred and self._cadence() == 0.0:
                    await self._settle_due()
            finally:
                self.busy = False
                self.on_change()

    def _settling_now(self) -> bool:
        """Whether paths are settling (:attr:`settling_total`), or read and held back by a source."""
        return self._holding_reads > 0 or self.settling_total > 0

    def _rescan_later(self) -> bool:
        """A periodic rescan is due: whether it waits for the paths settling now (see ``rescan_wait``)."""
        now = time.monotonic()
        since = self._rescan_since
        if self.rescan_wait > 0.0 and self._settling_now() and (since is None or now - since < self.rescan_wait):
            if since is None:
                self._rescan_since = now
                self.stats.rescans_waited += 1
            return True
        self._rescan_since = None
        return False

    def _cadence(self) -> float:
        """Seconds the next settling step waits: while paths trickle in, steps come at most every :data:`_CADENCE`.

        A step that took everything due at its time is followed by the next one no sooner than ``_CADENCE``
        later: paths falling due one after another (a writer at a few thousand files a second) go in a step
        and a batch every 20 ms, not one each a few milliseconds apart (each step and batch costs thread
        hand-offs, a prune verdict, a journal write). A step cut short by its size is followed at once.
        """
        if not self._drained:
            return 0.0
        return max(0.0, self._settled_at + _CADENCE - time.monotonic())

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
            self._rescan_since = None  # a walk of every root runs now: a periodic one waiting is done with it
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

    def _force(self, f: Force, now: float) -> None:
        reason = f.reason
        slots = [self.slots[f.consumer]] if f.consumer in self.slots else list(self.slots.values())
        for s in slots:
            for p in f.paths or ():
                key = os.fspath(p)
                if s.owns(key, p) or key in s.records.by_str:
                    if reason is Reason.DRIFT:
                        s.drift.correcting(key)
                    self.agg.observe((s.name, key), now, reason=reason, forced=True)
                elif reason is Reason.DRIFT:
                    s.drift.forget(key)  # the file went while its correction waited: nothing to guard

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

    # Reconcile -------------------------------------------------------------------
    async def reconcile(
        self,
        tops: list[Path] | None,
        reason: Reason,
        *,
        forced: bool = False,
        only: str | None = None,
        periodic: bool = False,
    ) -> None:
        """Walk ``tops`` (every root when ``None``) and observe what differs from the records.

        A ``periodic`` rescan (the timer's) of every root is *covered*: in a directory that a
        live watch (:attr:`coverage`) has covered, by the same arming, since before the
        previous rescan of every root began (which stat-ed it whole), and that lies on a
        local file system, it stats only the regular files whose inode falls in this
        rescan's share (one of :attr:`full_rescan_every`, in turn) and lists the rest.
        Everything else is stat-ed on every rescan, and other rescans stat every file.

        The walk and the diff run in a worker thread. Nothing is copied per record for
        it: the thread only reads the live records and filter memo with single ``get``
        calls (atomic under the GIL, and a record read a moment later than the walk is
        still one the consumer acknowledged), and takes the record keys in one
        ``list()`` for the deletion pass.

        A walk of every root (neither the start-up pass nor a forced one) stops at its next
        directory when events are lost again meanwhile (:meth:`emit`), for up to :data:`_STOP_FOR`
        seconds of walks stopped in a row: what it met is observed, nothing is judged gone, and the
        new loss's walk starts at once instead of after it. That walk goes on where the stopped one
        was and then walks again what it had walked (:class:`~reloadd._pipeline._changes.Resume`): a storm of
        losses costs no walk begun again from the top, and each walk still meets the whole tree.
        """
        slots = [self.slots[only]] if only else list(self.slots.values())
        jobs: list[tuple[str, str, bool]] = []  # (top, root, recursive)
        for s in slots:
            for root in s.filter.roots:
                if tops is None:
                    jobs.append((str(root), str(root), s.filter.recursive))
                    continue
                for top in tops:
                    if under(top, root):
                        jobs.append((str(top), str(root), s.filter.recursive))
                    elif under(root, top):
                        jobs.append((str(root), str(root), s.filter.recursive))
        jobs = list(dict.fromkeys(jobs))
        views = [View(s.name, s.filter, s._owns, s.records.packed, s.queue.queued_fingerprint, self.agg.is_settling,
                       frozenset(s.queue.guard.held), s.queue.guard if tops is None else None,
                       s.queue.pending_additions, s.records.keys_version)
                 for s in slots]
        scopes = [str(t) for t in tops] if tops is not None else None
        covered: frozenset[str] | None = None
        listings_of: frozenset[str] | None = None  # a pass that stats every file but keeps these listings
        share = (self.full_rescan_every, 0)
        now_covered: dict[str, int] | None = None
        if tops is None and only is None:
            now_covered = self.coverage.snapshot()
            last = self._trusted
            if periodic and not forced and last is not None and self.full_rescan_every > 1:
                covered = frozenset(d for d, serial in last.items() if now_covered.get(d) == serial) or None
                share = (self.full_rescan_every, self._tick % self.full_rescan_every)
                self._tick += 1
            elif reason is Reason.STARTUP and now_covered:
                # Every file stat-ed, as ever (every directory's turn), and the listing of each directory a watch
                # covered as the pass began kept: the first periodic rescan does not list again one unchanged since.
                listings_of, share = frozenset(now_covered), (1, 0)
        started = time.perf_counter()
        # A walk of every root may be stopped for a newer loss (not the start-up pass: readiness waits for its end).
        stoppable = tops is None and only is None and not forced and reason is not Reason.STARTUP
        stop = threading.Event() if stoppable else None
        resume = self._resume if stoppable and covered is None else None
        published: deque[tuple[str, dict[str, object]]] = deque()  # appended to by the walk's thread as it goes
        walking = [s.name for s in slots]
        self._walking.update(walking)
        self._walk_stop = stop
        walk = asyncio.ensure_future(asyncio.to_thread(
            diff, jobs, views, scopes, forced, covered or listings_of, share, self._listings, stop, self._recorded,
            resume, lambda name, seen: published.append((name, seen))))
        try:
            found = await self._while_walking(walk, published, reason, forced)
        finally:
            self._walk_stop = None
            self._walking.subtract(walking)
            if not walk.done():
                if stop is not None:
                    stop.set()
                walk.cancel()
        if found.stopped:
            if self._stopping_since is None:
                self._stopping_since = time.monotonic()
            self._resume = found.resume
            self.stats.restarted_rescans += 1
            now_covered = None  # not every directory was walked: trust nothing new
            if covered is not None:
                self._tick -= 1  # its share of the stat rotation was not done: the next periodic walk does it
        elif tops is None and only is None:
            self._stopping_since = None  # a whole walk of every root: nothing to go on with
            self._resume = None
        if now_covered is not None:
            self._trusted = now_covered  # this walk stat-ed whole every directory it did not trust
            for d in [d for d in self._listings if d not in now_covered]:
                del self._listings[d]  # no watch on it any more (removed, or lost): its listing is not kept
        if tops is None:
            self.stats.rescans += 1
            self.stats.covered_rescans += covered is not None
            self.stats.rescan_seconds += time.perf_counter() - started
        for view in views:
            slot = self.slots.get(view.name)
            if slot is not None:
                slot._owns.update(view.learned)
                if view.name in found.roots:
                    slot.queue.guard.remember_roots(found.roots[view.name])
        for key, error in found.errors:
            self._warn(key, error)
        published.extend((name, seen) for name, seen in found.observe.items() if seen)  # what came after the last chunk
        self._take_published(published, reason, forced)
        self._take_found(self._feed())  # the rest a settling step's worth per turn of the pump
        for slot in slots:
            if len(slot._owns) > _OWNS_CACHE:
                slot._owns = {}  # the walk's verdicts served their observations: drop a 100k-path table

    async def _while_walking(self, walk: asyncio.Future[Diff], published: deque[tuple[str, dict[str, object]]],
                             reason: Reason, forced: bool) -> Diff:
        """Wait for ``walk``, settling what it found so far meanwhile: its findings flow out as it walks.

        Every :data:`_FLOW` seconds, what the walk published is taken as findings (due a quiet period after
        they were taken, as a walk's findings are after it ends), a step of them goes into the aggregator
        once due, and what is due is settled and handed over. A consumer under a running walk
        :meth:`holds` (its ``after`` dependents and group mates wait for the walk's end).
        """
        while True:
            await asyncio.wait({walk}, timeout=_FLOW)
            self._take_published(published, reason, forced)
            if walk.done():
                return walk.result()
            self._take_due_findings()
            await self._settle_due()
            self.on_change()

    def _take_due_findings(self) -> float | None:
        """Take a settling step of the oldest findings in once their quiet period ran out.

        Returns when the next findings are due (``None``: none wait).
        """
        if self._found and self.clock() >= self._findings_ready():
            self._take_found(self._feed())
        return self._findings_ready() if self._found else None

    def _findings_ready(self) -> float:
        """When the oldest waiting findings are due: a quiet period after their walk took them."""
        f = self._found[0]
        return f.when + self.agg.timing(f.name).quiet

    def _take_published(self, published: deque[tuple[str, dict[str, object]]], reason: Reason, forced: bool) -> None:
        """Queue what a running walk found so far as findings (taken into the aggregator a step at a time)."""
        when = self.clock()
        while published:
            name, seen = published.popleft()
            if name in self.slots:
                self._found.append(_Findings(name, seen, when, reason, forced))

    def _take_found(self, limit: int) -> None:
        """Take up to ``limit`` of the walks' findings into the aggregator (oldest walk first).

        A finding is due a quiet period after its walk ended (:attr:`_Findings.when`), as if it had been
        taken in then: one taken in later is due at once. A path its consumer no longer owns is dropped.
        """
        now = self.clock()
        observe = self.agg.observe
        while limit > 0 and self._found:
            f = self._found[0]
            slot = self.slots.get(f.name)
            n = min(f.left, limit)
            packed = slot.records.packed if slot is not None else {}  # a dict's own `in`, in C
            for key in itertools.islice(f.rest, n):
                if slot is not None and (key in packed or slot.owns(key)):
                    observe((f.name, key), now, reason=f.reason, forced=f.forced, verify=True, seen=f.seen[key],
                            since=f.when)
            limit -= n
            f.at += n
            if not f.left:
                self._found.popleft()

    def _held_too_long(self, key: Key, p: Pending, growing: bool, now: float) -> bool:
        """A path handed over because ``max_hold`` ran out while a writer was still at it: say so, return True."""
        t = self.agg.timing(key[0])
        if now - p.first < t.max_hold:
            return False
        if p.writing and now - p.last < t.max_delay:
            why = "is still open for writing"
        elif p.verify and growing:
            why = "is still growing"
        else:
            return False
        writers = writers_of([key[1]]).get(key[1])
        by = f" by pid {', '.join(map(str, writers))}" if writers else ""
        log.warning("Handing %s over to consumer %s although it %s%s: held %.0fs, the longest max_hold allows",
                    key[1], key[0], why, by, now - p.first)
        return True

    def _warn(self, path: str, error: str) -> None:
        if self._warned.get(path) != error:
            self._warned[path] = error
            log.warning("Ignoring %s: %s", path, error)

    # Settling --------------------------------------------------------------------
    async def _settle_due(self) -> None:
        now = self.clock()
        limit = self._feed()
        due = self.agg.due(now, limit=limit)  # the rest is due at once: the pump comes straight back
        self._backlog = len(due) >= limit
        if self._has_room():
            self._room.set()
        if not due:
            return
        self._settled_at, self._drained = time.monotonic(), len(due) < limit
        jobs = [(key, self._root_of(key)) for key in due]
        here = self._on_loop(jobs)
        reads = self._reads(jobs, here)
        probes, known = (probe_all(jobs, reads, _SMALL) if here
                          else await asyncio.to_thread(probe_all, jobs, reads, _SMALL))
        released: list[tuple[Key, Path, Fingerprint | None, bool, Reason]] = []
        overdue: set[Key] = set()  # handed over at max_hold while still written: no second settle
        now = self.clock()
        for (key, root), pr in zip(jobs, probes, strict=True):
            if pr.error is not None:
                self._warn(key[1], pr.error)
            seen = self.agg.get(key)
            growing = seen is not None and seen.verify and not steady(seen.seen, pr.fingerprint)
            p = self.agg.probed(key, pr.fingerprint, now)
            if p is not None:
                released.append((key, root, pr.fingerprint, p.forced, p.reason))
                if self._held_too_long(key, p, growing, now):
                    overdue.add(key)
        keys = [r[0] for r in released]
        self._in_hand.update(keys)
        self._in_hand_by.update([k[0] for k in keys])
        try:
            await self._hand_over(released, overdue, here, known)
        finally:
            self._in_hand.clear()
            self._in_hand_by.clear()

    def _feed(self) -> int:
        """Keys to settle in one turn: two batches of the queue that takes the largest ones.

        What is settled and handed over in one step is held in memory at once (probes, digests, queued
        items): a slow consumer's queue is fed 1,024 at a time. A queue whose consumer acknowledges fast
        grows its batches while a backlog waits beyond the batch it took (``WorkQueue.batch_size``), and
        the feed grows with them, up to :data:`_FEED_MAX`. For :data:`_STORM` seconds after events were
        lost it is :data:`_STORM_STEP`: the next loss's walk waits for a settling step to end, so the
        step is kept short (an overflow's rescan starts within ~100 ms of it, not after 1,024 digests).
        """
        if time.monotonic() - self._lost < _STORM:
            return _STORM_STEP
        batch = max((slot.queue.batch_size for slot in self.slots.values()), default=0)
        return max(_STEP, min(2 * batch, _FEED_MAX))

    async def _hand_over(self, released: list[tuple[Key, Path, Fingerprint | None, bool, Reason]],
                         overdue: frozenset[Key] | set[Key] = frozenset(), on_loop: bool = False,
                         known: dict[tuple[str, Fingerprint], str | None] | None = None) -> None:
        """Digest and queue what a settling step released; ``on_loop``: the step was probed on the loop, and
        its small files the watch reported are read there too (see :meth:`_on_loop`). ``known``: the digests
        the probes read (:meth:`_reads`), at the fingerprints they found; those files are not read again (the
        table is the step's own: the rest are added to it)."""
        digesting = self._digesting()
        here: list[tuple[str, Fingerprint]] = []  # read on the loop
        away: list[tuple[str, Fingerprint]] = []  # read in a worker thread
        for key, _, fp, _, reason in released:
            if fp is not None and key[0] in digesting and (known is None or (key[1], fp) not in known):
                (here if on_loop and reason is _INOTIFY and fp[1] <= _SMALL else away).append((key[1], fp))
        digests: dict[tuple[str, Fingerprint], str | None] = known if known is not None else {}
        if here:
            digests.update(digest_all(self.digests, here))
        if away:
            digests.update(await asyncio.to_thread(digest_all, self.digests, away))
        holds = await self._judge_removals(released)
        items: dict[str, list[Item]] = {}  # per consumer, in order: one wake-up of each queue for the step
        for key, root, fp, forced, reason in released:
            slot = self.slots.get(key[0])
            if slot is None:
                continue
            digest = digests.get((key[1], fp)) if fp is not None else None
            if digest is CHANGED:
                if key not in overdue:
                    self.agg.observe(key, self.clock(), reason=reason, forced=forced, verify=True)
                    continue  # changed while being read: settle again
                digest = None  # still written after max_hold: handed over as it is, without a digest
            if digest is not None and digest.startswith(UNREADABLE):
                self._warn(key[1], f"cannot read for a content digest: {digest[len(UNREADABLE):]}")
                digest = None  # hand it over without one: the consumer reports its own error
            self.stats.handed_over += 1
            item = Item(key[1], root, fp, digest, forced, reason)
            if fp is None:
                item.hold = holds.get(key)
            per = items.get(key[0])
            if per is None:
                per = items[key[0]] = []
            per.append(item)
        for name, per in items.items():
            self.slots[name].queue.put_all(per)

    def _digesting(self) -> set[str]:
        """The consumers whose changes carry a content digest."""
        return {name for name, slot in self.slots.items() if slot.consumer.content_digest}

    def _reads(self, jobs: list[tuple[Key, Path]], on_loop: bool) -> list[bool]:
        """Which paths of a settling step its probes read at once for their digests (:func:`probe_all`): those
        of a consumer that wants digests, the watch reported when probed on the loop (the rule of
        :meth:`_hand_over`), any in a worker thread. A file still written when probed is read for nothing
        (it settles again); one written in a burst is probed once, when it is done."""
        digesting = self._digesting()
        if not digesting:
            return [False] * len(jobs)
        if not on_loop:
            return [key[0] in digesting for key, _ in jobs]
        get = self.agg.get
        return [key[0] in digesting and (p := get(key)) is not None and p.reason is _INOTIFY for key, _ in jobs]

    def _on_loop(self, jobs: list[tuple[Key, Path]]) -> bool:
        """Whether a settling step is probed on the loop (and its small files the watch reported read there for
        their digests): when the watch reported every path of it and they are at most :data:`_ON_LOOP`, or
        when they are at most :data:`_OFFLOAD`; else the step goes to a worker thread.

        A trickle (a writer at up to ~20,000 files a second) settles in steps of a few dozen to a few hundred
        paths every 20 ms; a worker thread for each step's probes and reads cost two hand-offs to the thread
        and back, and the GIL handed over and back at each system call while the loop works on: a modify burst
        of 100,000 files written at 10,000 a second took 5.0-5.7 s of CPU that way, 4.4-4.7 s on the loop; one
        created at ~12,000 a second 3.87-4.24 s with steps of up to 256 on the loop, 3.74-4.00 with up to
        1,024 (~10 ms of the loop's time a step); and a changed file waits for no thread. A bigger step (a
        burst) goes to a thread, whose system calls
        overlap the loop's work on the rest of the burst (on the loop, the last of a 100,000-file burst
        came up to ~0.8 s later). A walk's findings may be on a slow mount (a rescan is what watches NFS),
        and a file a walk found may not have been read for months (a disk read): a thread past 64.
        """
        return len(jobs) <= _OFFLOAD or (len(jobs) <= _ON_LOOP and all(
            (p := self.agg.get(key)) is not None and p.reason is _INOTIFY for key, _ in jobs))

    async def _judge_removals(
        self, released: list[tuple[Key, Path, Fingerprint | None, bool, Reason]]
    ) -> dict[Key, str]:
        """Deletions whose input looks lost (see :mod:`reloadd._pipeline._prune`): held instead of handed over."""
        gone: dict[str, list[str]] = {}
        slots = self.slots
        for key, _, fp, _, _ in released:
            if fp is None and (slot := slots.get(key[0])) is not None and key[1] in slot.records.packed:
                gone.setdefault(key[0], []).append(key[1])
        if not gone:
            return {}

        def judge() -> dict[Key, str]:
            return {(name, k): why for name, keys in gone.items()
                    for k, why in self.slots[name].queue.guard.check(keys).items()}

        return await asyncio.to_thread(judge)

    def _root_of(self, key: Key) -> Path:
        slot = self.slots.get(key[0])
        root = slot.filter.root_of(key[1]) if slot else None
        return root if root is not None else Path(os.path.dirname(key[1]))


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
