"""Settling and hand-over: what the aggregator releases is probed, digested and queued for its consumer.

The engine's lowest part (:class:`Settling`, under :class:`~reloadd._pipeline._rescans.Rescans` and
:class:`~reloadd._pipeline._intake.Intake`). A settling step takes what is due (a walk's findings first go into the
aggregator a step's worth at a time, :class:`Findings`), probes each path once (a stat, off the loop when many),
computes content digests for consumers that want them, judges removals whose input looks lost, and puts the
released paths on the owning consumer's :class:`~reloadd._pipeline._queue.WorkQueue`. It also answers what is
settling (:meth:`Settling.holds`: what ``after`` waits for; :meth:`Settling.held_long`: what status lists).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .._types import Fingerprint, Reason
from ._aggregator import Aggregator, Key, Pending
from ._changes import CHANGED, UNREADABLE, digest_all, probe_all, steady
from ._digests import DigestCache
from ._pump_state import PumpState
from ._queue import Item
from ._slot import Slot
from ._stats import EngineStats
from ._writers import writers_of

__all__ = ["Findings", "Settling"]

log = logging.getLogger("reloadd.engine")

_ON_LOOP = 1024  # a settling step of up to this many paths the watch reported is probed and read on the loop
_OFFLOAD = 64  # a step of more paths than this, any a walk found, is probed in a worker thread
_SMALL = 16 * 1024  # bytes: a file the watch reported up to this size may be read for its digest on the loop
_STEP = 1024  # keys of a walk's findings taken in, and settled, per turn at least (see Settling._feed)
_FEED_MAX = 4096  # keys settled per turn at most (a fast consumer's backlog: see Settling._feed)
_STORM_STEP = 256  # keys settled per turn then (a step's digests take ~15 ms, not ~60)
_STORM = 2.0  # seconds after a loss of events during which settling goes in the smallest steps (see Settling._feed)
_BACKLOG = 8192  # paths settling (or handed in, not taken yet) beyond which a source holds its reads (see Intake.room)


@dataclass(slots=True)
class Findings:
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


class Settling:
    """The engine's settling and hand-over (see the module's docstring): the state every part of it reads.

    Args:
        slots: The consumers.
        aggregator: The aggregator (timings per consumer already set).
        clock: Monotonic clock.
        on_change: Called after every step (idle tracking).
    """

    def __init__(self, slots: Iterable[Slot], aggregator: Aggregator, clock: Callable[[], float],
                 on_change: Callable[[], None]) -> None:
        self.slots = {s.name: s for s in slots}
        self.agg = aggregator
        self.clock = clock
        self.on_change = on_change
        self.digests = DigestCache()
        self.stats = EngineStats()
        self.pump_state = PumpState()
        """What the pump is doing and waits for (its transitions: :class:`~reloadd._pipeline._pump_state.PumpState`)."""
        self._warned: dict[str, str] = {}
        self._in_hand: set[Key] = set()  # released by the aggregator, not yet on a queue
        self._in_hand_by: Counter[str] = Counter()
        self._walking: Counter[str] = Counter()  # consumers under a walk running now
        self._found: deque[Findings] = deque()  # walks' findings not yet taken into the aggregator
        self._room = asyncio.Event()  # set: a source may hand more events in (see Intake.room)
        self._room.set()
        self._backlog = False  # the last settling step was cut short by its size: more was due than it takes
        self._handed_in = 0  # events handed in by emit_all and not taken by the pump yet

    def _has_room(self) -> bool:
        if self._handed_in >= _BACKLOG:
            return False  # a source parsed read after read without a turn of the pump: let it take them first
        return not self._backlog or len(self.agg) + self._handed_in < _BACKLOG

    @property
    def settling_total(self) -> int:
        """Paths settling: held in the aggregator, or found by a walk and waiting to be (see :class:`Findings`)."""
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
        return (self._in_hand_by[consumer] > 0 or self._walking[consumer] > 0 or self.pump_state.held_reads > 0
                or self._found_left(consumer) > 0 or self.agg.holds_fresh(consumer, self.clock()))

    def holds_any(self, consumer: str, paths: Callable[[Path], bool]) -> bool:
        """Whether a path of ``consumer`` for which ``paths`` is true is settling (as :meth:`holds` counts)."""
        if not self.holds(consumer):
            return False
        if self._walking[consumer] > 0 or self.pump_state.held_reads > 0:
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
    def _settling_now(self) -> bool:
        """Whether paths are settling (:attr:`settling_total`), or read and held back by a source."""
        return self.pump_state.held_reads > 0 or self.settling_total > 0

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

    def _take_found(self, limit: int) -> None:
        """Take up to ``limit`` of the walks' findings into the aggregator (oldest walk first).

        A finding is due a quiet period after its walk ended (:attr:`Findings.when`), as if it had been
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
        self.pump_state.settled(time.monotonic(), len(due) < limit)
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
        if time.monotonic() - self.pump_state.last_loss < _STORM:
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


_INOTIFY = Reason.INOTIFY  # an enum member read as a class attribute costs ~0.1 µs
