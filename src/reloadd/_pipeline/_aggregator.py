"""The coalescing aggregator: decides *when* a path has settled. Pure; no I/O, no clock of its own.

Events for one (consumer, path) key collapse into one pending entry. The entry is
*due* for a probe once no event arrived for ``quiet`` seconds, or ``max_delay`` after
its first event if it keeps changing. A path a writer still holds open (a MODIFY
without the CLOSE_WRITE) is held until the writer closes it, or has been idle for
``max_delay``. Observations that carry no writer information (a rescan, the start-up
pass, a sub-tree re-examination) must see the same fingerprint on two probes
``quiet`` apart, so a file still growing is not handed over.

Both holds are bounded by ``max_hold``: a log kept open and appended forever, or a file
that never stops growing, is handed over once it has been held that long (the engine
logs it), and again after each further ``max_hold`` while it goes on. Whatever waits
for a held path (a consumer ``after`` this one, a group mate) waits at most
``max_delay`` for it: see :meth:`Aggregator.holds_fresh`.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .._types import Fingerprint, Reason
from ._changes import UNSEEN, steady

__all__ = ["Aggregator", "Key", "Pending", "Timing"]

Key = tuple[str, str]
"""(consumer name, path as a string)."""

@dataclass(frozen=True, slots=True)
class Timing:
    """Settle timing of one consumer, in seconds."""

    quiet: float = 0.05
    max_delay: float = 5.0
    max_hold: float = 60.0
    at_once: bool = False
    """A file moved into place (and nothing else happened to it) is due at once (``arrival_at_once``)."""


@dataclass(slots=True)
class Pending:
    """What the aggregator holds for one key until it settles."""

    first: float
    last: float
    reason: Reason
    forced: bool = False
    writing: bool = False
    verify: bool = False
    seen: object = UNSEEN  # Fingerprint | None at the previous probe (or a walk's stat), or UNSEEN
    events: int = 1
    arrived: bool = False  # its only event so far: a complete file moved into place
    queued: float | None = None  # when its one live heap entry falls due; None while out for a probe


class Aggregator:
    """Collapse events per key and release keys once settled.

    Args:
        timings: Settle timing per consumer name; consumers not listed use ``default``.
        default: The timing for consumers without an override.
    """

    def __init__(self, timings: dict[str, Timing] | None = None, default: Timing | None = None) -> None:
        self._timings = dict(timings or {})
        self._default = default or Timing()
        self._pending: dict[Key, Pending] = {}
        # When each held key falls due: a heap of the distinct times, and per time its keys in the order they were
        # scheduled, after the index of the next one to look at. A burst's events share their read's time, so
        # 100,000 keys sit under a few hundred times: no per-key heap entry to sift past equal times (a pop of a
        # 100,000-entry heap of (time, key) compared keys all the way down, ~4 µs), and keys due together go
        # out in the order they came.
        self._times: list[float] = []
        self._at: dict[float, list[Any]] = {}  # [index of the next key, the time, key, key, ...]
        self._per_consumer: Counter[str] = Counter()
        self.coalesced = 0
        """Events folded into an already-pending entry (a metric)."""

    def set_timing(self, consumer: str, timing: Timing) -> None:
        """Override the timing of one consumer."""
        self._timings[consumer] = timing

    def timing(self, consumer: str) -> Timing:
        """The timing in force for ``consumer``."""
        return self._timings.get(consumer, self._default)

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, key: object) -> bool:
        return key in self._pending

    def keys(self) -> Iterable[Key]:
        """Keys currently held."""
        return self._pending.keys()

    def holds(self, consumer: str) -> bool:
        """Whether any path of ``consumer`` is still settling."""
        return self._per_consumer[consumer] > 0

    def count(self, consumer: str) -> int:
        """How many paths of ``consumer`` are settling."""
        return self._per_consumer[consumer]

    def holds_fresh(self, consumer: str, now: float) -> bool:
        """Whether a path of ``consumer`` has been settling for less than its ``max_delay``.

        What others wait for (``after``, a group's mates): a path held longer (open for
        writing, still growing) no longer holds them back. Entries are kept in the order
        they were first seen, so only the newest of the consumer needs a look.
        """
        if not self._per_consumer[consumer]:
            return False
        limit = now - self.timing(consumer).max_delay
        for key in reversed(self._pending):  # newest first: stop at the first entry too old to count
            if self._pending[key].first <= limit:
                return False
            if key[0] == consumer:
                return True
        return False

    def overdue(self, consumer: str, now: float) -> list[tuple[str, Pending]]:
        """The paths of ``consumer`` settling for longer than its ``max_delay``, oldest first."""
        if not self._per_consumer[consumer]:
            return []
        limit = now - self.timing(consumer).max_delay
        out = []
        for key, p in self._pending.items():
            if p.first > limit:
                break  # first-seen order: the rest are younger
            if key[0] == consumer:
                out.append((key[1], p))
        return out

    def is_settling(self, key: Key) -> bool:
        """Whether ``key`` is held now (one dict lookup: safe to call from another thread)."""
        return key in self._pending

    def get(self, key: Key) -> Pending | None:
        """The pending entry of ``key``, if any."""
        return self._pending.get(key)

    def observe(
        self,
        key: Key,
        now: float,
        *,
        reason: Reason,
        writing: bool | None = None,
        forced: bool = False,
        verify: bool = False,
        seen: object = UNSEEN,
        arrived: bool = False,
        since: float | None = None,
    ) -> None:
        """Record an event for ``key``.

        Args:
            key: (consumer, path).
            now: The current time.
            reason: Why the event happened (the first reason of a burst is kept,
                except that a forced resync wins).
            writing: True for an event that shows a writer still at work (MODIFY),
                False for one that shows it finished (CLOSE_WRITE, MOVED_TO, DELETE),
                None when the event says nothing about writers.
            forced: Hand the path over even if its content did not change.
            verify: The observation carries no writer information: require two equal
                probes before hand-over.
            seen: What the observation saw of the path (a walk's stat): the first of those two
                probes, for a path not held yet.
            arrived: A complete file was moved into place (IN_MOVED_TO): when that is all that
                happened to the path and its consumer's timing says ``at_once``, it is due at once
                (no quiet period to wait out).
            since: When ``seen`` was taken, if before ``now`` (a walk's findings taken in later): for a
                path not held yet, the quiet period runs from then.
        """
        p = self._pending.get(key)
        if p is None:
            p = Pending(first=now, last=now if since is None or not verify else min(now, since), reason=reason,
                        forced=forced, verify=verify, seen=seen if verify else UNSEEN, arrived=arrived and not verify)
            self._pending[key] = p
            self._per_consumer[key[0]] += 1
        else:
            self.coalesced += 1
            p.events += 1
            p.arrived = False  # more happened to it: the quiet period as ever
            if not verify or writing is not None:
                # A walk re-finding a held path says nothing new about its writer: only real
                # events restart the quiet period (else slow rescans could hold it forever).
                p.last = now
            p.forced = p.forced or forced
            if forced:
                p.reason = reason
            if writing is not None or not verify:
                p.verify = p.verify and verify
        if writing is not None:
            p.writing = writing
            if not verify:
                p.verify = False
        if p.queued is None or self._due_at(key, p) < p.queued:
            self._push(key, p)
        # else its live heap entry comes up first and is moved on to the later time then: one entry
        # per held path, not one per event (a burst of 100k files is 300k events)

    def _due_at(self, key: Key, p: Pending) -> float:
        t = self._timings.get(key[0], self._default)
        if p.writing:
            return min(p.last + t.max_delay, p.first + t.max_hold)  # an idle writer, or one that never closes
        if p.arrived and t.at_once:
            return p.last
        if p.verify:
            return p.last + t.quiet  # growth checks are not cut short (probed() bounds them by max_hold)
        return min(p.last + t.quiet, max(p.first + t.max_delay, p.last))

    def _push(self, key: Key, p: Pending) -> None:
        when = self._due_at(key, p)
        keys = self._at.get(when)
        if keys is None:
            self._at[when] = [2, when, key]
            heapq.heappush(self._times, when)
        else:
            when = keys[1]  # the time's one float, not one per held path (32 B each at a burst's peak)
            keys.append(key)
        p.queued = when

    def _top(self) -> tuple[float, Key, Pending] | None:
        """The earliest live entry, with stale ones skipped and late ones moved on."""
        times, at, pending = self._times, self._at, self._pending
        while times:
            when = times[0]
            keys = at[when]
            i: int = keys[0]
            while i < len(keys):
                key: Key = keys[i]
                p = pending.get(key)
                if p is None or p.queued != when:
                    i += 1  # superseded by an earlier entry, or released
                    continue
                keys[0] = i
                if self._due_at(key, p) != when:  # events since pushed it later (or a timing changed)
                    keys[0] = i + 1
                    self._push(key, p)
                    break  # it may now fall due before this time: look again from the top
                return when, key, p
            else:
                heapq.heappop(times)
                del at[when]
                if not times:
                    self._at = at = {}  # a dict never shrinks: drop a burst's table
        return None

    def next_deadline(self) -> float | None:
        """When the earliest held key becomes due, or ``None`` when nothing is held."""
        top = self._top()
        return None if top is None else top[0]

    def due(self, now: float, limit: int | None = None) -> list[Key]:
        """Keys whose settle time has come (they stay held until :meth:`probed`)."""
        out: list[Key] = []
        while limit is None or len(out) < limit:
            top = self._top()
            if top is None or top[0] > now:
                break
            keys = self._at[top[0]]
            keys[0] += 1
            top[2].queued = None
            out.append(top[1])
        return out

    def distrust_writers(self, now: float) -> int:
        """Events were lost (overflow): a held writer's CLOSE_WRITE may never come.

        Every entry held for an open writer is switched to the two-probe growth check
        instead. Returns how many were switched.
        """
        n = 0
        for key, p in self._pending.items():
            if p.writing:
                p.writing = False
                p.verify = True
                p.last = now
                self._push(key, p)
                n += 1
        return n

    def probed(self, key: Key, fingerprint: Fingerprint | None, now: float) -> Pending | None:
        """Report what a probe of a due key found.

        Returns:
            The released entry when the key is settled and must be handed over;
            ``None`` when it is held for another quiet period (it changed since the
            previous probe) or is no longer held.
        """
        p = self._pending.get(key)
        if p is None:
            return None
        growing = not steady(p.seen, fingerprint)  # UNSEEN equals no fingerprint
        if p.verify and growing and now - p.first < self.timing(key[0]).max_hold:
            p.seen = fingerprint
            p.last = now
            self._push(key, p)
            return None
        del self._pending[key]
        self._per_consumer[key[0]] -= 1
        if not self._pending:
            self._pending = {}  # a dict never shrinks: drop a burst's table (5 MiB at 100k paths)
        return p

    def requeue(self, key: Key, now: float) -> None:
        """Hold a due key for another quiet period (the probe could not decide)."""
        p = self._pending.get(key)
        if p is not None:
            p.last = now
            p.arrived = False
            self._push(key, p)
