"""The engine core: source events in, settled items out to each consumer's queue.

One pump task owns the aggregator. It folds every event into it, probes keys once they
are due (a stat, off the loop when many), computes content digests for consumers that
want them, and puts released paths on the owning consumer's :class:`WorkQueue`.
Structural events (a new or moved directory, a ConfigMap swap, a periodic or overflow
rescan, a forced resync) become a *reconcile*: a stat walk compared against what each
consumer acknowledged, so only what differs enters the aggregator.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ._aggregator import Aggregator, Key
from ._consumer import Consumer
from ._filters import PathFilter, under
from ._queue import Item, WorkQueue
from ._scan import DigestCache, Probe, probe, walk
from ._sources.base import EventKind, SourceEvent
from ._state import RecordStore
from ._types import Fingerprint, Reason

__all__ = ["Engine", "EngineStats", "Force", "Slot"]

log = logging.getLogger("reloadd.engine")

_OFFLOAD = 64  # probes beyond this many go to a worker thread
_OWNS_CACHE = 1 << 20


@dataclass
class Slot:
    """A consumer as the engine holds it."""

    consumer: Consumer
    filter: PathFilter
    records: RecordStore
    queue: WorkQueue

    @property
    def name(self) -> str:
        """The consumer's name."""
        return self.consumer.name

    def __post_init__(self) -> None:
        self._owns: dict[Path, bool] = {}
        self._bad_accepts: set[Path] = set()

    def owns(self, path: Path) -> bool:
        """Whether ``path`` is this consumer's business (the path filter is memoised)."""
        hit = self._owns.get(path)
        if hit is None:
            if len(self._owns) >= _OWNS_CACHE:
                self._owns.clear()
            hit = self._owns[path] = self.filter(path)
        if not hit:
            return False
        try:
            return bool(self.consumer.accepts(path))
        except Exception as exc:  # a plugin bug must not stop the pump for everyone
            if path not in self._bad_accepts:
                self._bad_accepts.add(path)
                log.error("Failed to filter %s in consumer %s: %s", path, self.name, exc)
            return False


@dataclass(frozen=True)
class Force:
    """Hand paths over again, forced: all of a consumer's (``paths=None``) or some."""

    consumer: str | None = None
    paths: tuple[Path, ...] | None = None


@dataclass
class EngineStats:
    """Counters a metrics exporter reads."""

    events: Counter[tuple[str, str]] = field(default_factory=Counter)
    overflows: int = 0
    rescans: int = 0
    rescan_seconds: float = 0.0
    resyncs: int = 0
    handed_over: int = 0


class Engine:
    """Own the aggregator and feed the consumers' queues.

    Args:
        slots: The consumers.
        aggregator: The aggregator (timings per consumer already set).
        clock: Monotonic clock.
        on_change: Called after every step (idle tracking).
    """

    def __init__(
        self,
        slots: Iterable[Slot],
        aggregator: Aggregator,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.slots = {s.name: s for s in slots}
        self.agg = aggregator
        self.clock = clock
        self.on_change = on_change
        self.inbox: asyncio.Queue[SourceEvent | Force] = asyncio.Queue()
        self.digests = DigestCache()
        self.stats = EngineStats()
        self.busy = False
        self.startup_done = asyncio.Event()
        self._warned: dict[Path, str] = {}
        self._in_hand: set[Key] = set()  # released by the aggregator, not yet on a queue
        self._in_hand_by: Counter[str] = Counter()

    # Input -----------------------------------------------------------------------
    def emit(self, event: SourceEvent | Force) -> None:
        """Queue an event for the pump (callable from sources and signal handlers)."""
        self.inbox.put_nowait(event)
        self.on_change()

    @property
    def idle(self) -> bool:
        """No event waiting, nothing held, nothing being worked on."""
        return (
            self.inbox.empty()
            and not self.busy
            and len(self.agg) == 0
            and all(s.queue.idle for s in self.slots.values())
        )

    def holds(self, consumer: str) -> bool:
        """Whether paths of ``consumer`` are still settling (held or being handed over)."""
        return self.agg.holds(consumer) or self._in_hand_by[consumer] > 0

    def holds_any(self, consumer: str, paths: Callable[[Path], bool]) -> bool:
        """Whether a path of ``consumer`` for which ``paths`` is true is still settling."""
        if not self.holds(consumer):
            return False
        return any(k[0] == consumer and paths(k[1]) for k in (*self.agg.keys(), *self._in_hand))

    # The pump --------------------------------------------------------------------
    async def pump(self) -> None:
        """Process events and settle paths until cancelled."""
        while True:
            deadline = self.agg.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - self.clock())
            events: list[SourceEvent | Force] = []
            try:
                events.append(await asyncio.wait_for(self.inbox.get(), timeout))
            except TimeoutError:
                pass
            while not self.inbox.empty():
                events.append(self.inbox.get_nowait())
            self.busy = True
            try:
                if events:
                    await self._process(events)
                await self._settle_due()
            finally:
                self.busy = False
                self.on_change()

    async def _process(self, events: list[SourceEvent | Force]) -> None:
        now = self.clock()
        subtrees: set[Path] = set()
        rescan: Reason | None = None
        resync = False
        resync_only: set[str] = set()
        for ev in events:
            if isinstance(ev, Force):
                if ev.paths is not None:
                    self._force(ev, now)
                elif ev.consumer is None:
                    resync = True
                elif ev.consumer in self.slots:
                    resync_only.add(ev.consumer)
                continue
            self.stats.events[(ev.source, ev.kind.value)] += 1
            if ev.kind is EventKind.RESCAN:
                if ev.source in ("inotify", "supervisor"):  # events were lost
                    self.stats.overflows += ev.source == "inotify"
                    self.agg.distrust_writers(now)
                if rescan is not Reason.STARTUP:
                    rescan = Reason.STARTUP if ev.source == "startup" else Reason.RESCAN
            elif ev.kind is EventKind.RESYNC:
                resync = True
            elif ev.kind is EventKind.SUBTREE and ev.path is not None:
                subtrees.add(ev.path)
            elif ev.path is not None:
                self._observe_file(ev, now)
        if resync:
            self.stats.resyncs += 1
            await self.reconcile(None, Reason.SIGNAL, forced=True)
        elif rescan is not None:
            await self.reconcile(None, rescan)
        elif subtrees:
            tops = [p for p in subtrees if not any(q != p and under(p, q) for q in subtrees)]
            await self.reconcile(tops, Reason.INOTIFY)
        if not resync:
            for name in sorted(resync_only):
                await self.reconcile(None, Reason.SIGNAL, forced=True, only=name)
        if rescan is Reason.STARTUP:
            self.startup_done.set()

    def _observe_file(self, ev: SourceEvent, now: float) -> None:
        assert ev.path is not None
        writing = {EventKind.WRITING: True, EventKind.WRITTEN: False, EventKind.GONE: False}.get(ev.kind)
        for slot in self.slots.values():
            if slot.owns(ev.path):
                self.agg.observe((slot.name, ev.path), now, reason=Reason.INOTIFY, writing=writing)

    def _force(self, f: Force, now: float) -> None:
        slots = [self.slots[f.consumer]] if f.consumer in self.slots else list(self.slots.values())
        for s in slots:
            for p in f.paths or ():
                if s.owns(p) or p in s.records:
                    self.agg.observe((s.name, p), now, reason=Reason.SIGNAL, forced=True)

    # Reconcile -------------------------------------------------------------------
    async def reconcile(
        self, tops: list[Path] | None, reason: Reason, *, forced: bool = False, only: str | None = None
    ) -> None:
        """Walk ``tops`` (every root when ``None``) and observe what differs from the records.

        The walk and the diff against each consumer's records run in a worker thread on
        copies taken here, so a 100k-file rescan does not stall the event loop.
        """
        slots = [self.slots[only]] if only else list(self.slots.values())
        jobs: list[tuple[Path, Path, bool]] = []  # (top, root, recursive)
        for s in slots:
            for root in s.filter.roots:
                if tops is None:
                    jobs.append((root, root, s.filter.recursive))
                    continue
                for top in tops:
                    if under(top, root):
                        jobs.append((top, root, s.filter.recursive))
                    elif under(root, top):
                        jobs.append((root, root, s.filter.recursive))
        jobs = list(dict.fromkeys(jobs))
        views = [
            _View(s.name, s.filter, dict(s._owns), {p: r.fingerprint for p, r in s.records.items()},
                  s.queue.queued_fingerprints())
            for s in slots
        ]
        pending = set(self.agg.keys())
        started = time.perf_counter()
        diff = await asyncio.to_thread(_diff, jobs, views, tops, forced, pending)
        if tops is None:
            self.stats.rescans += 1
            self.stats.rescan_seconds += time.perf_counter() - started
        for view in views:
            slot = self.slots.get(view.name)
            if slot is not None:
                slot._owns.update(view.learned)
        for path, error in diff.errors:
            self._warn(path, error)
        now = self.clock()
        for name, path in diff.observe:
            slot = self.slots.get(name)
            if slot is not None and (path in slot.records or slot.owns(path)):
                self.agg.observe((name, path), now, reason=reason, forced=forced, verify=True)

    def _warn(self, path: Path, error: str) -> None:
        if self._warned.get(path) != error:
            self._warned[path] = error
            log.warning("Ignoring %s: %s", path, error)

    # Settling --------------------------------------------------------------------
    async def _settle_due(self) -> None:
        now = self.clock()
        due = self.agg.due(now)
        if not due:
            return
        jobs = [(key, self._root_of(key)) for key in due]
        if len(jobs) > _OFFLOAD:
            probes = await asyncio.to_thread(_probe_all, jobs)
        else:
            probes = _probe_all(jobs)
        released: list[tuple[Key, Path, Fingerprint | None, bool, Reason]] = []
        now = self.clock()
        for (key, root), pr in zip(jobs, probes, strict=True):
            if pr.error is not None:
                self._warn(key[1], pr.error)
            p = self.agg.probed(key, pr.fingerprint, now)
            if p is not None:
                released.append((key, root, pr.fingerprint, p.forced, p.reason))
        self._in_hand.update(key for key, *_ in released)
        self._in_hand_by.update(key[0] for key, *_ in released)
        try:
            await self._hand_over(released)
        finally:
            self._in_hand.clear()
            self._in_hand_by.clear()

    async def _hand_over(self, released: list[tuple[Key, Path, Fingerprint | None, bool, Reason]]) -> None:
        want = [
            (key[1], fp)
            for key, _, fp, _, _ in released
            if fp is not None and self.slots[key[0]].consumer.content_digest
        ]
        digests: dict[tuple[Path, Fingerprint], str | None] = {}
        if want:
            digests = await asyncio.to_thread(_digest_all, self.digests, want)
        for key, root, fp, forced, reason in released:
            slot = self.slots.get(key[0])
            if slot is None:
                continue
            digest = digests.get((key[1], fp)) if fp is not None else None
            if digest is _CHANGED:
                self.agg.observe(key, self.clock(), reason=reason, forced=forced, verify=True)
                continue  # changed while being read: settle again
            if digest is not None and digest.startswith(_UNREADABLE):
                self._warn(key[1], f"cannot read for a content digest: {digest[len(_UNREADABLE):]}")
                digest = None  # hand it over without one: the consumer reports its own error
            self.stats.handed_over += 1
            slot.queue.put(Item(key[1], root, fp, digest, forced, reason))

    def _root_of(self, key: Key) -> Path:
        slot = self.slots.get(key[0])
        root = slot.filter.root_of(key[1]) if slot else None
        return root if root is not None else key[1].parent


def _walk_all(jobs: list[tuple[Path, Path, bool]]) -> dict[Path, Probe]:
    out: dict[Path, Probe] = {}
    for top, root, recursive in jobs:
        for path, pr in walk(top, root, recursive=recursive):
            out[path] = pr
    return out


def _probe_all(jobs: list[tuple[Key, Path]]) -> list[Probe]:
    return [probe(key[1], root) for key, root in jobs]


_CHANGED = "changed"
_UNREADABLE = "unreadable:"


def _digest_all(
    cache: DigestCache, want: list[tuple[Path, Fingerprint]]
) -> dict[tuple[Path, Fingerprint], str | None]:
    out: dict[tuple[Path, Fingerprint], str | None] = {}
    for p, fp in want:
        try:
            d = cache.digest(p, fp)
        except OSError as exc:
            d = _UNREADABLE + (exc.strerror or str(exc))
        out[(p, fp)] = _CHANGED if d is None else d
    return out


@dataclass
class _View:
    """A consumer as the reconcile thread sees it: copies, never the live objects."""

    name: str
    filter: PathFilter
    owns: dict[Path, bool]
    fingerprints: dict[Path, Fingerprint | None]
    queued: dict[Path, Fingerprint | None]
    learned: dict[Path, bool] = field(default_factory=dict)


@dataclass
class _Diff:
    observe: list[tuple[str, Path]] = field(default_factory=list)
    errors: list[tuple[Path, str]] = field(default_factory=list)


def _diff(
    jobs: list[tuple[Path, Path, bool]],
    views: list[_View],
    tops: list[Path] | None,
    forced: bool,
    pending: set[Key],
) -> _Diff:
    """Walk and compare with each consumer's acknowledged fingerprints (blocking)."""
    found = _walk_all(jobs)
    out = _Diff()
    warned: set[Path] = set()
    for v in views:
        for path, pr in found.items():
            owned = v.owns.get(path)
            if owned is None:
                owned = v.learned[path] = v.filter(path)
            if not owned:
                continue
            if pr.error is not None:
                if path not in warned:
                    warned.add(path)
                    out.errors.append((path, pr.error))
                continue
            if forced or (v.name, path) in pending:
                out.observe.append((v.name, path))
            elif (
                v.fingerprints.get(path, _MISSING) != pr.fingerprint
                and v.queued.get(path, _MISSING) != pr.fingerprint
            ):
                out.observe.append((v.name, path))  # differs from what was acknowledged and what is queued
        scopes = tops if tops is not None else list(v.filter.roots)
        for path in v.fingerprints:
            pr_found = found.get(path)
            if (pr_found is None or pr_found.fingerprint is None) and any(under(path, t) for t in scopes):
                out.observe.append((v.name, path))
    return out


_MISSING: object = object()
