"""How a :class:`~reloadd.Reloader` is wired: one consumer's slot, its callbacks, and the sources' contexts.

The private half of the facade, a base of ``Reloader`` (:mod:`reloadd._reloader` keeps the public API: its
lifecycle, triggers and status): the callbacks a consumer is bound with (``ctx.trigger``,
``ctx.removal_held``, health changes), a consumer's queue and its waits (``after``, groups), the sources to run
and the context each gets, the supervision that rebuilds a failed one, and calls handed to the reloader's loop
from other threads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ._config import Config, ConsumerConfig
from ._consumer import Consumer, HealthReporting, SourceProvider
from ._errors import WatchLimitError
from ._order import group_matcher
from ._pipeline._building import RemovalHeld, Trigger, group_function, owner_test, path_filter
from ._pipeline._drift import DriftBook
from ._pipeline._engine import Engine, Force, Slot
from ._pipeline._plugins import SOURCE_GROUP, load
from ._pipeline._prune import PruneGuard
from ._pipeline._queue import WorkQueue
from ._pipeline._supervisor import supervise
from ._source import EventKind, Source, SourceContext, SourceEvent, WatchRoot
from ._state._records import RecordStore
from ._types import DriftMode, Reason
from ._watch import Watch, WatchState

__all__ = ["Pump", "SourceFactory", "Wiring"]

log = logging.getLogger("reloadd")

SourceFactory = Callable[[SourceContext], Source]


class Wiring:
    """The wiring of a :class:`~reloadd.Reloader`; the state it reads is set up by ``Reloader.__init__``."""

    config: Config
    watch: Watch
    _engine: Engine | None
    _clock: Callable[[], float]
    _loop: asyncio.AbstractEventLoop | None
    _groups: dict[str, tuple[tuple[str, ...], ...]]
    _passed: set[tuple[str, str]]
    _armed: asyncio.Event
    _rebuilt: set[str]
    _live: dict[str, Source]
    _source_factories: Sequence[SourceFactory] | None
    _signals: bool
    _notify: Callable[[], None]

    # Consumers ---------------------------------------------------------------------
    def _trigger_for(self, name: str) -> Trigger:
        def trigger(paths: Iterable[Path] | None) -> None:
            forced = None if paths is None else tuple(Path(p) for p in paths)
            self._call_in_loop(self._force, name, forced, Reason.TRIGGER)

        return trigger

    def _removal_held_for(self, name: str) -> RemovalHeld:
        def removal_held(path: Path) -> str | None:
            engine = self._engine
            slot = engine.slots.get(name) if engine is not None else None
            return slot.queue.guard.removal_held(path) if slot is not None else None

        return removal_held

    def _slot(self, consumer: Consumer, records: RecordStore, cc: ConsumerConfig) -> Slot:
        filt = path_filter(consumer, cc)

        group_of = group_function(consumer) or group_matcher(cc.group, filt.roots)
        name = consumer.name
        self._groups[name] = cc.group
        drift = DriftBook(name, cc.drift)
        queue = WorkQueue(
            consumer, records, concurrency=consumer.concurrency, on_change=self._notify, clock=self._clock,
            waits_for=self._waits_for(name, cc.after) if cc.after else None,
            group_of=group_of,
            group_settling=self._group_settling(name, group_of) if group_of is not None else lambda g: False,
            group_label=lambda g: self._group_label(name, g),
            guard=PruneGuard(filt, records.by_str, owner_test(consumer, filt), records.directory,
                             health=records.health),
            drift=drift,
            upstream=lambda: self._engine is not None and self._engine.holds(name),
        )
        return Slot(consumer, filt, records, queue, drift)

    def _waits_for(self, name: str, after: tuple[str, ...]) -> Callable[[], tuple[str, ...]]:
        def busy() -> tuple[str, ...]:
            engine = self._engine
            if engine is None:
                return ()
            waiting = []
            for n in after:
                if engine.holds(n) or engine.slots[n].queue.has_fresh_work() or health_settling(
                        engine.slots[n].consumer):
                    waiting.append(n)
                elif engine.agg.holds(n):  # only paths held past max_delay: go ahead, and say so
                    self._passing(name, n, "consumer", engine.held_long(n))
            return tuple(waiting)

        return busy

    def _health_changed(self) -> None:
        """A consumer's health changed (see :class:`~reloadd.HealthReporting`): its ``after`` dependents look again."""
        self._call_in_loop(self._notify)

    def _group_settling(self, name: str, group_of: Callable[[Path], str | None]) -> Callable[[str], bool]:
        def settling(group: str) -> bool:
            engine = self._engine
            if engine is None:
                return False
            if engine.holds_any(name, lambda p: group_of(p) == group):
                return True
            mates = [h for h in engine.held_long(name) if group_of(Path(h[0])) == group]
            if mates:
                self._passing(name, name, f"group {self._group_label(name, group)} mate", mates)
            return False

        return settling

    def _passing(self, name: str, holder: str, what: str, held: list[tuple[str, str, float]]) -> None:
        """Consumer ``name`` no longer waits for these paths held past max_delay: one WARNING per path."""
        for path, why, seconds in held:
            if (name, path) not in self._passed:
                self._passed.add((name, path))
                log.warning("Consumer %s goes ahead without %s %s (%s): %s for %.0fs, longer than max_delay",
                            name, what, path, holder, why, seconds)

    def _group_label(self, name: str, group: str) -> str:
        """A group named by its globs (``tls.crt + tls.key``), not by its index."""
        globs = self._groups.get(name, ())
        return " + ".join(globs[int(group)]) if group.isdigit() and int(group) < len(globs) else group

    # Sources -----------------------------------------------------------------------
    def _sources(self) -> list[tuple[str, SourceFactory]]:
        if self._source_factories is not None:
            return [(getattr(f, "name", f"source{i}"), f) for i, f in enumerate(self._source_factories)]
        names = (["inotify"] if self.config.inotify else []) + ["rescan"]
        if self._signals:
            names.append("signal")
        return [(n, load(SOURCE_GROUP, n)) for n in names]

    def _far_side_sources(self, slots: list[Slot]) -> list[tuple[str, SourceFactory]]:
        """Sources the consumers contribute (``SourceProvider``), named ``<consumer>/<source>``."""
        out: list[tuple[str, SourceFactory]] = []
        for slot in slots:
            if not isinstance(slot.consumer, SourceProvider) or slot.drift.mode is DriftMode.OFF:
                continue
            for i, factory in enumerate(slot.consumer.sources()):
                name = getattr(factory, "name", None) or getattr(getattr(factory, "func", None), "name", f"source{i}")
                out.append((f"{slot.name}/{name}", factory))
        return out

    def _source_context(self, name: str | None = None) -> SourceContext:
        assert self._engine is not None
        roots: dict[Path, WatchRoot] = {}
        for slot in self._engine.slots.values():
            for r in slot.filter.roots:
                prev = roots.get(r)
                roots[r] = WatchRoot(r, slot.filter.recursive or (prev.recursive if prev else False))
        return SourceContext(
            roots=tuple(roots.values()),
            emit=self._engine.emit,
            rescan_interval=self.config.rescan_interval,
            logger=logging.getLogger("reloadd.source"),
            degraded=lambda reason: self._degraded(reason, name),
            coverage=self._engine.coverage,
            emit_all=self._engine.emit_all,
            room=self._engine.room,
        )

    def _degraded(self, reason: str | None, source: str | None = None) -> None:
        self._armed.set()  # armed as far as the kernel allows: the start-up walk may go
        if source in self._rebuilt and self._engine is not None:
            # A watch rebuilt after a failure is armed: walk once more. The walk asked for at the failure
            # ran while nothing watched; a change made after it and before this arming is seen by neither.
            self._rebuilt.discard(source)
            self._engine.emit(SourceEvent(EventKind.RESCAN, None, "supervisor"))
        if reason is None:
            self.watch = Watch(WatchState.ARMED)
        else:
            self.watch = Watch(WatchState.DEGRADED, reason)
        self._notify()

    async def _supervise(self, name: str, factory: SourceFactory) -> None:
        """Run one source forever; rebuild it after any failure, then rescan everything."""

        def on_limit(exc: WatchLimitError, first: bool) -> None:
            if first and self.watch.state is not WatchState.DEGRADED:
                log.error("%s", exc)
            self._degraded(str(exc))

        def rescan() -> None:
            if self._engine is not None:
                self._engine.emit(SourceEvent(EventKind.RESCAN, None, "supervisor"))
                self._rebuilt.add(name)  # ...and once more when its new watch reports itself armed (``_degraded``)

        live: dict[str, Any] = self._live
        await supervise(name, lambda: factory(self._source_context(name)), live=live, on_limit=on_limit,
                        rescan=rescan)

    # Calls from other threads ------------------------------------------------------
    def _force(self, consumer: str | None, paths: Iterable[Path] | None, reason: Reason = Reason.SIGNAL) -> None:
        if self._engine is None:
            return
        self._engine.emit(Force(consumer, tuple(Path(p) for p in paths) if paths is not None else None, reason))

    def _call_in_loop(self, fn: Callable[..., None], *args: object) -> None:
        """Run ``fn`` now when on the reloader's loop, else hand it over thread-safely."""
        loop = self._loop
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop or loop.is_closed():
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)


class Pump:
    """The engine's pump as a source-like task, so the same supervisor restarts it."""

    name = "pump"

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def run(self) -> None:
        await self.engine.pump()  # a restarted pump starts waiting (PumpState.restart)


def health_settling(consumer: Consumer) -> bool:
    """Whether ``consumer`` says what it delivered is still on its way to healthy (its ``after`` dependents wait)."""
    if not isinstance(consumer, HealthReporting):
        return False
    try:
        return consumer.health().settling
    except Exception:  # a plugin bug must not stop the consumers after it for ever
        return False

