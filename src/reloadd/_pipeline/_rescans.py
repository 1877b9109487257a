"""Forced passes and rescans: a walk compared against what each consumer acknowledged, its findings settled.

Structural events (a new or moved directory, a ConfigMap swap, a periodic or overflow rescan, a forced resync)
become a *reconcile* (:meth:`Rescans.reconcile`): a stat walk in a worker thread, compared against the records,
so only what differs is settled, a settling step's worth at a time (the walk's own table holds the rest, see
:class:`~reloadd._pipeline._settle.Findings`). A forced pass of some paths (:class:`Force` with ``paths``) puts
them straight into the aggregator (:meth:`Rescans._force`).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .._filters import under
from .._source import Coverage
from .._types import Reason
from ._aggregator import Aggregator
from ._changes import Diff, Recorded, Resume, View, diff
from ._scan import Listing
from ._settle import Findings, Settling
from ._slot import OWNS_CACHE, Slot

__all__ = ["Force", "Rescans"]

_FLOW = 0.05  # seconds between looks at what a running walk found so far (see Rescans._while_walking)
_STOP_FOR = 60.0  # seconds walks of every root may keep being stopped for newer losses (then one runs to its end)


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


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a walk of every root stats and lists (see :meth:`Rescans._plan`)."""

    covered: frozenset[str] | None = None  # directories whose files it stats only in its share of them
    listings_of: frozenset[str] | None = None  # a pass that stats every file but keeps these listings
    share: tuple[int, int] = (1, 0)  # (of how many rescans, which one): whose covered files it stats
    now_covered: dict[str, int] | None = None  # the coverage as it began (trusted once it walked everything)


class Rescans(Settling):
    """The engine's forced passes and rescans (see the module's docstring), over its settling.

    Args:
        full_rescan_every: Periodic rescans over which every file is stat-ed once (see :class:`Engine`).
    """

    def __init__(self, slots: Iterable[Slot], aggregator: Aggregator, clock: Callable[[], float],
                 on_change: Callable[[], None], full_rescan_every: int) -> None:
        super().__init__(slots, aggregator, clock, on_change)
        self.coverage = Coverage()
        """Directories the sources report every change in (given to them in their context)."""
        self.full_rescan_every = max(1, full_rescan_every)
        self._tick = 0  # periodic rescans so far: which share of the covered directories the next one stats
        self._trusted: dict[str, int] | None = None  # the coverage as the last rescan of every root began
        self._listings: dict[str, Listing] = {}  # covered directories as a periodic rescan listed them
        self._recorded: dict[str, Recorded] = {}  # each consumer's recorded paths as the last walk took them
        self._walk_stop: threading.Event | None = None  # set to stop the walk of every root running now
        self._stopping_since: float | None = None  # the first of the walks stopped in a row (see _STOP_FOR)
        self._resume: Resume | None = None  # where the last walk of every root was stopped

    def _stop_walk(self) -> None:
        """Events were just lost: stop the walk of every root running now, unless walks were stopped too long."""
        since = self._stopping_since
        if self._walk_stop is not None and (since is None or time.monotonic() - since < _STOP_FOR):
            # A walk running now may have passed where events were just lost: it stops at its next
            # directory (what it met is kept) and the new loss's walk starts at once, going on where
            # that one stopped, then walking again what it had walked.
            self._walk_stop.set()

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
        directory when events are lost again meanwhile (:meth:`~reloadd._pipeline._intake.Intake.emit`), for up
        to :data:`_STOP_FOR` seconds of walks stopped in a row: what it met is observed, nothing is judged gone,
        and the new loss's walk starts at once instead of after it. That walk goes on where the stopped one
        was and then walks again what it had walked (:class:`~reloadd._pipeline._changes.Resume`): a storm of
        losses costs no walk begun again from the top, and each walk still meets the whole tree.
        """
        slots = [self.slots[only]] if only else list(self.slots.values())
        jobs = _walk_jobs(slots, tops)
        views = [View(s.name, s.filter, s._owns, s.records.packed, s.queue.queued_fingerprint, self.agg.is_settling,
                       frozenset(s.queue.guard.held), s.queue.guard if tops is None else None,
                       s.queue.pending_additions, s.records.keys_version)
                 for s in slots]
        scopes = [str(t) for t in tops] if tops is not None else None
        every = tops is None and only is None  # a walk of every root, for every consumer
        plan = self._plan(reason, forced, periodic) if every else _Plan(share=(self.full_rescan_every, 0))
        started = time.perf_counter()
        # A walk of every root may be stopped for a newer loss (not the start-up pass: readiness waits for its end).
        stoppable = every and not forced and reason is not Reason.STARTUP
        published: deque[tuple[str, dict[str, object]]] = deque()  # appended to by the walk's thread as it goes
        found = await self._walk(slots, jobs, views, scopes, forced, plan, reason, stoppable, published)
        self._walked(found, plan, every)
        if tops is None:
            self.stats.rescans += 1
            self.stats.covered_rescans += plan.covered is not None
            self.stats.rescan_seconds += time.perf_counter() - started
        self._take_walk(found, views, slots, published, reason, forced)

    def _plan(self, reason: Reason, forced: bool, periodic: bool) -> _Plan:
        """What a walk of every root stats: a periodic one only its share of the files a live watch covered since
        the last one began, the start-up pass every file (keeping the covered directories' listings)."""
        now_covered = self.coverage.snapshot()
        last = self._trusted
        if periodic and not forced and last is not None and self.full_rescan_every > 1:
            covered = frozenset(d for d, serial in last.items() if now_covered.get(d) == serial) or None
            share = (self.full_rescan_every, self._tick % self.full_rescan_every)
            self._tick += 1
            return _Plan(covered, None, share, now_covered)
        if reason is Reason.STARTUP and now_covered:
            # Every file stat-ed, as ever (every directory's turn), and the listing of each directory a watch
            # covered as the pass began kept: the first periodic rescan does not list again one unchanged since.
            return _Plan(None, frozenset(now_covered), (1, 0), now_covered)
        return _Plan(None, None, (self.full_rescan_every, 0), now_covered)

    async def _walk(self, slots: list[Slot], jobs: list[tuple[str, str, bool]], views: list[View],
                    scopes: list[str] | None, forced: bool, plan: _Plan, reason: Reason, stoppable: bool,
                    published: deque[tuple[str, dict[str, object]]]) -> Diff:
        """Run the walk and the diff in a worker thread, settling what it publishes meanwhile (``published``)."""
        stop = threading.Event() if stoppable else None
        resume = self._resume if stoppable and plan.covered is None else None
        walking = [s.name for s in slots]
        self._walking.update(walking)
        self._walk_stop = stop
        walk = asyncio.ensure_future(asyncio.to_thread(
            diff, jobs, views, scopes, forced, plan.covered or plan.listings_of, plan.share, self._listings, stop,
            self._recorded, resume, lambda name, seen: published.append((name, seen))))
        try:
            return await self._while_walking(walk, published, reason, forced)
        finally:
            self._walk_stop = None
            self._walking.subtract(walking)
            if not walk.done():
                if stop is not None:
                    stop.set()
                walk.cancel()

    def _walked(self, found: Diff, plan: _Plan, every: bool) -> None:
        """Keep what a walk of every root leaves for the next: where it was stopped, the coverage it can trust."""
        now_covered = plan.now_covered
        if found.stopped:
            if self._stopping_since is None:
                self._stopping_since = time.monotonic()
            self._resume = found.resume
            self.stats.restarted_rescans += 1
            now_covered = None  # not every directory was walked: trust nothing new
            if plan.covered is not None:
                self._tick -= 1  # its share of the stat rotation was not done: the next periodic walk does it
        elif every:
            self._stopping_since = None  # a whole walk of every root: nothing to go on with
            self._resume = None
        if now_covered is not None:
            self._trusted = now_covered  # this walk stat-ed whole every directory it did not trust
            for d in [d for d in self._listings if d not in now_covered]:
                del self._listings[d]  # no watch on it any more (removed, or lost): its listing is not kept

    def _take_walk(self, found: Diff, views: list[View], slots: list[Slot],
                   published: deque[tuple[str, dict[str, object]]], reason: Reason, forced: bool) -> None:
        """Take a finished walk's results: the filter verdicts it learned, the roots it saw, its errors, and the
        rest of its findings (a settling step's worth into the aggregator now, the rest per turn of the pump)."""
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
            if len(slot._owns) > OWNS_CACHE:
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

    def _take_published(self, published: deque[tuple[str, dict[str, object]]], reason: Reason, forced: bool) -> None:
        """Queue what a running walk found so far as findings (taken into the aggregator a step at a time)."""
        when = self.clock()
        while published:
            name, seen = published.popleft()
            if name in self.slots:
                self._found.append(Findings(name, seen, when, reason, forced))


def _walk_jobs(slots: list[Slot], tops: list[Path] | None) -> list[tuple[str, str, bool]]:
    """What to walk for ``slots``: (top, root, recursive) for each root, or each of ``tops`` under one, once each."""
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
    return list(dict.fromkeys(jobs))
