"""What came of a work queue's batches: results applied to the records, retries, durable writes, and the view.

The other half of :class:`reloadd._pipeline._queue.WorkQueue` (which takes paths in and hands batches over):
:class:`Results` turns what a consumer's ``handle()`` returned or raised into records, held removals and
retries with backoff, writes the records and held removals durably (off the event loop, backed off while
writes fail), and reads the queue for status and metrics (:class:`QueueCounts`, :class:`QueueStats`).
It is a base of ``WorkQueue`` rather than an object of its own so the per-path paths (``_acknowledge_all``,
``_apply``) read the queue's state with no hop more than before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .._consumer import Consumer, PruneAware
from .._errors import ConsumerError, StateError
from .._outcomes import result_of
from .._state._packed import data_json_of, data_of, dumps
from .._state._records import RecordStore
from .._types import Ack, Batch, Change, ChangeKind, Hold, Reject, Result, Retry
from ._drift import DriftBook
from ._holds import HeldRemovals
from ._item import Item
from ._prune import PruneGuard

__all__ = ["QueueCounts", "QueueStats", "Results"]

log = logging.getLogger("reloadd.queue")

_DELETED = ChangeKind.DELETED  # an enum member read as a class attribute costs ~0.1 µs
_HOLDS_EVERY = 1.0  # seconds: the held removals' file is rewritten at most this often


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """A queue's sizes at one moment."""

    pending: int
    in_flight: int
    failing: int
    untried: int
    rejected: int
    first_tries: int = 0
    """In flight with no failed attempt before (a retry in flight is counted by ``failing``)."""


@dataclass(slots=True)
class QueueStats:
    """Counters a metrics exporter reads."""

    batches: int = 0
    acked: int = 0
    rejected: int = 0
    retried: int = 0
    dropped_unchanged: int = 0
    last_success: float | None = None

class Results:
    """A work queue's results, retries and durable writes, and its status: the state it reads is
    :class:`~reloadd._pipeline._queue.WorkQueue`'s, set up by its ``__init__``."""

    consumer: Consumer
    records: RecordStore
    guard: PruneGuard
    drift: DriftBook | None
    stats: QueueStats
    waiting_for: tuple[str, ...]
    _packed: Mapping[str, bytes]
    _items: dict[str, Item]
    _inflight: dict[str, Item]
    _held: HeldRemovals
    _held_groups: frozenset[str]
    _group_label: Callable[[str], str]
    _delay: Callable[[int], float]
    _backoff_max: float
    _on_change: Callable[[], None]
    _clock: Callable[[], float]
    _upstream: Callable[[], bool]
    _flush_lock: asyncio.Lock
    _accepting: bool
    _tidying: bool
    _persist_pending: bool
    _retry_pending: bool
    _holds_written: float

    # Inspection ------------------------------------------------------------------
    def oldest_age(self) -> float:
        """Seconds the oldest waiting path has waited (0 when none).

        Paths the consumer deferred on purpose (``Retry(failure=False)``: a move grace, a standby waiting
        for the Lease) are not waiting on reloadd, so they do not count: a standby stays ready. A retry in
        flight still counts (it has failed, and may again): readiness does not flap with every attempt.
        """
        retrying = [i for i in list(self._inflight.values()) if i.last_error is not None]
        waiting = [i.since for i in [*self._items.values(), *retrying]
                   if i.deferred is None or i.last_error is not None]
        if not waiting:
            return 0.0
        return max(0.0, self._clock() - min(waiting))

    def counts(self) -> QueueCounts:
        """Waiting, in-flight, retrying and never-tried paths, and rejected records (cheap)."""
        failing = len(self._failing())
        untried = sum(1 for p, i in self._items.items()
                      if i.last_error is None and i.deferred is None and p not in self._inflight)
        first_tries = sum(1 for i in self._inflight.values() if i.last_error is None)
        return QueueCounts(len(self._items), len(self._inflight), failing, untried, self.records.rejected(),
                           first_tries)

    def _failing(self) -> dict[str, Item]:
        """Paths whose last attempt failed: waiting in backoff, or being retried right now."""
        out = {p: i for p, i in self._inflight.items() if i.last_error is not None}
        out.update((p, i) for p, i in self._items.items() if i.last_error is not None)
        return out

    def status(self) -> dict[str, Any]:
        """A JSON-able view for ``reloadd status``."""
        now = self._clock()
        failing = [
            {
                "path": i.key,
                "attempts": i.attempts,
                "error": i.last_error,
                "retry_in": round(max(0.0, i.not_before - now), 3) if i.key in self._items else 0.0,
            }
            for i in self._failing().values()
        ]
        rejected = [{"path": p, "error": error} for p, error in self.records.errors()]
        deferred = [
            {"path": i.key, "reason": i.deferred, "retry_in": round(max(0.0, i.not_before - now), 3)}
            for i in self._items.values()
            if i.deferred is not None and i.last_error is None
        ]
        return {
            "pending": sorted(str(p) for p in self._items),
            "in_flight": sorted(str(p) for p in self._inflight),
            "failing": failing,
            "deferred": deferred,
            "rejected": rejected,
            "oldest_pending_age": round(self.oldest_age(), 3),
            "waiting_for": list(self.waiting_for),
            "held_groups": sorted(self._group_label(g) for g in self._held_groups),
            "prune_held": self._held.listing(),
            "prune_held_unit": self.consumer.removal_unit if isinstance(self.consumer, PruneAware) else "files",
            "batches": self.stats.batches,
            "last_success": self.stats.last_success,
        }

    # Durable writes --------------------------------------------------------------
    def tidy(self) -> None:
        """Idle after a burst: write the compaction a burst put off (in the background), if one is due."""
        if not self._tidying and self._accepting and self.records.compaction_due and not self.records.health.retry_in():
            self._tidying = True
            self._held.spawn(self._tidy())

    async def _tidy(self) -> None:
        try:
            await self.flush()
        finally:
            self._tidying = False

    def _persist_soon(self) -> None:
        """Write the held removals soon: one flush for every hold made in this turn of the loop."""
        if self.records.persistent and not self._persist_pending:
            self._persist_pending = True
            self._held.spawn(self._persist())

    async def _persist(self, delay: float = 0.0) -> None:
        if delay:
            await asyncio.sleep(delay)
        self._persist_pending = False  # a hold made while this flush runs schedules another
        await self.flush()

    # Results ---------------------------------------------------------------------
    async def _handle(self, batch: Batch) -> Mapping[Path, Result]:
        results = await self.consumer.handle(batch)
        if not isinstance(results, Mapping):
            raise TypeError(f"handle() returned {type(results).__name__}, expected a mapping")
        return results

    async def _one_by_one(self, batch: Batch, exc: Exception) -> dict[Path, Result]:
        """Hand each path of a batch whose ``handle()`` raised over alone, so only the culprit fails.

        The consumer cannot say which path an exception belongs to; splitting finds out at
        the cost of one call per path. Paths it already acted on are handed over again,
        which the at-least-once contract allows.
        """
        n = len(batch.changes)
        if isinstance(exc, ConsumerError):
            log.debug("Consumer %s raised for a batch of %d paths; handing them over one by one",
                      self.consumer.name, n, exc_info=exc)
        else:
            log.error("Failed to handle batch of %d path(s) in consumer %s: %s; handing them over one by one",
                      n, self.consumer.name, exc, exc_info=exc)
        results: dict[Path, Result] = {}
        for change in batch.changes:
            try:
                got = await self._handle(replace(batch, changes=(change,)))
            except Exception as one:
                results[change.path] = self._map_error(one, change.path)
            else:
                result = got.get(change.path)
                if result is not None:
                    results[change.path] = result
        return results

    def _map_error(self, exc: Exception, path: Path) -> Result:
        """The core's error policy (:func:`reloadd._outcomes.result_of`)."""
        return result_of(exc, self.consumer.name, path)

    def _acknowledge_all(self, items: Sequence[Item], changes: Sequence[Change],
                         texts: Sequence[str | None] | None = None) -> None:
        """Record each item as acknowledged, with the consumer's data as JSON ``texts`` (``None``: the data its
        record had, kept as the text it is stored as); a removal is forgotten. One loop for a batch: the calls
        per path of ``_apply`` cost ~1.5 µs a path in a burst."""
        packed, records, drift = self._packed, self.records, self.drift
        done = self.guard.done if self.guard.confirmed else None  # removals a person confirmed: none, mostly
        for i, (item, change) in enumerate(zip(items, changes, strict=True)):
            key = item.key
            if done is not None:
                done(key)
            deleted = change.kind is _DELETED
            if deleted:
                records.drop(key)
            else:
                if texts is None:
                    prev = packed.get(key)
                    text = data_json_of(prev) if prev is not None else None
                else:
                    text = texts[i]
                records.set_json(key, item.fingerprint, item.digest, text)
            if drift is not None:
                (drift.forget if deleted else drift.settled)(key)
        self.stats.acked += len(items)
        self.stats.last_success = time.time()

    def _apply(self, item: Item, change: Change, result: Result | None) -> None:
        path = item.key
        prev = self._packed.get(path)
        if result is None:  # acknowledged as handed over: the data kept as the JSON text it is stored as
            self._acknowledge_all((item,), (change,))
            return
        if isinstance(result, Ack):
            try:
                text = None if result.data is None else dumps(result.data)
            except (TypeError, ValueError) as exc:  # a plugin bug: keep the acknowledgement, not the data
                log.error("Consumer %s acknowledged %s with data that is not JSON (not kept): %s",
                          self.consumer.name, path, exc)
                text = None
            self._acknowledge_all((item,), (change,), (text,))
        elif isinstance(result, Reject):
            self.guard.done(path)
            self.stats.rejected += 1
            log.warning("Failed to handle %s in consumer %s (rejected until it changes or a SIGHUP): %s",
                        path, self.consumer.name, result.error)
            if change.kind is ChangeKind.DELETED:
                self.records.drop(path)
            else:
                data = result.data if result.data is not None else (data_of(prev) if prev else None)
                self.records.set(path, item.fingerprint, item.digest, data, result.error)
        elif isinstance(result, Hold):
            if path not in self._items and path not in self._held:  # else a newer change goes instead
                self._held.hold(item, result.why)
                self._on_change()
        elif isinstance(result, Retry):
            self.stats.retried += 1
            if path in self._items or path in self._held:
                return  # a newer change is already queued (or held); it goes next, without backoff
            if result.failure:
                item.attempts += 1
                item.last_error = result.error
                item.deferred = None
            else:
                item.deferred = result.error
            # A server's Retry-After counts, but never beyond the backoff cap (an hour's Retry-After is a bug).
            if result.after is None:
                delay = self._delay(max(1, item.attempts))
            else:
                delay = min(self._backoff_max, max(0.0, result.after))
            item.not_before = self._clock() + delay
            if result.failure:
                log.warning(
                    "Failed to handle %s in consumer %s (attempt %d, retrying in %.1fs): %s",
                    path, self.consumer.name, item.attempts, delay, result.error,
                )
            else:
                log.debug("Consumer %s defers %s for %.1fs: %s", self.consumer.name, path, delay, result.error)
            self._items[path] = item
        else:
            log.error("Consumer %s returned %r for %s; retrying", self.consumer.name, result, path)
            item.attempts += 1
            item.not_before = self._clock() + self._delay(item.attempts)
            item.last_error = f"invalid result {result!r}"
            self._items.setdefault(path, item)

    async def flush(self, *, final: bool = False) -> None:
        """Persist buffered record changes (written off the event loop, from a copy taken on it).

        The held removals (``prune.json``, the whole table each time) are written at most once per
        :data:`_HOLDS_EVERY` seconds, the last change always (a later flush, or ``final``): 100k removals
        held during a burst are not rewritten after every batch. What a crash loses of them is judged again
        at the next start, from the records, which are durable here.
        """
        health = self.records.health
        async with self._flush_lock:
            wait = health.retry_in()
            if wait and not final:
                # Writes are failing (a full or read-only disk): the acknowledgements stay buffered and the
                # consumer goes on; one retry is due after the backoff, not one per batch (50 a second).
                self._retry_later()
                return
            # In a burst (more queued, or on its way) a due compaction waits for the burst's last flush.
            job = self.records.prepare(busy=not final and (bool(self._items) or self._upstream()))
            if job is not None:
                try:
                    await asyncio.to_thread(self.records.write, job)
                except StateError as exc:
                    self.records.failed(job)
                    health.failed(exc)
                    self._retry_later()
                    if not final:
                        return  # the held removals wait for the retry too (at shutdown they are tried)
                else:
                    health.succeeded()
            if self.records.persistent and self.guard.dirty:
                wait = self._holds_written + _HOLDS_EVERY - time.monotonic()
                if wait > 0 and not final:
                    if not self._persist_pending:
                        self._persist_pending = True
                        self._held.spawn(self._persist(wait))
                    return
                holds = self.guard.prepare()
                if holds is not None:
                    self._holds_written = time.monotonic()
                    try:
                        await asyncio.to_thread(self.guard.write, holds)
                    except StateError as exc:
                        self.guard.failed()
                        health.failed(exc)
                        self._retry_later()
                        return
                    health.succeeded()

    def _retry_later(self) -> None:
        """Flush again once the backoff of a failed write has passed (no batch may come to do it)."""
        if not self._retry_pending and self._accepting:
            self._retry_pending = True
            self._held.spawn(self._retry())

    async def _retry(self) -> None:
        await asyncio.sleep(self.records.health.retry_in())
        self._retry_pending = False
        await self.flush()
