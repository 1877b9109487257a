"""The embedding API: :class:`Reloader` wires config, plugins, sources, engine and queues.

    async with Reloader(load_config("reloadd.toml")) as r:
        await r.serve()

``serve()`` returns after :meth:`Reloader.stop`; the synchronous :meth:`Reloader.run`
does the same from a plain function. Nothing process-global is touched unless asked:
signal handlers are installed only with ``install_signal_handlers=True`` (the CLI does),
and the previous handlers come back on close.

This module is the Reloader's public side (its lifecycle, triggers and status); how it is wired (each
consumer's queue and callbacks, the sources and their contexts) is its base, :class:`reloadd._wiring.Wiring`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._config import Config, ConsumerConfig
from ._consumer import Consumer
from ._errors import ConfigError
from ._observe import pipeline_snapshot
from ._order import check_after
from ._pipeline._aggregator import Aggregator, Timing
from ._pipeline._building import (
    PrivateDirs,
    arrives_at_once,
    bind,
    build_consumer,
    embedded_config,
    records_for,
    share_provisions,
)
from ._pipeline._engine import Engine
from ._pipeline._memory import give_back
from ._snapshot import Snapshot
from ._source import EventKind, Source, SourceEvent
from ._state._atomic import lock_state_dir
from ._state._records import RecordStore
from ._watch import Watch, WatchState
from ._wiring import Pump, SourceFactory, Wiring

if TYPE_CHECKING:
    from ._ops._services import Services

__all__ = ["Reloader"]

log = logging.getLogger("reloadd")

_TRIM_AFTER = 10_000  # paths handed over since the last trim that make the next idle spell trim
_TRIM_DELAY = 1.0  # seconds the reloader must stay idle first


class Reloader(Wiring):
    """Watch the configured folders and keep every consumer in step.

    Args:
        config: The configuration.
        consumers: Extra consumer objects (embedders' own), besides the configured ones.
        install_signal_handlers: Turn SIGHUP into a forced resync (standalone mode),
            chained to the host's previous handler and restored on close.
        serve_ops: Also run the operations services the configuration enables
            (``metrics_listen``: /metrics, /healthz, /readyz; ``control_socket``:
            ``reloadd status`` / ``reloadd reload``) for the reloader's lifetime, as
            :func:`reloadd.ops_services` does; they start before the consumers, so
            /healthz answers during a long start-up. systemd notification is left to
            the host process.
        sources: Source factories to use instead of the configured ones (tests,
            embedders with their own event feed).
        clock: Monotonic clock for the aggregator and queues.
    """

    def __init__(
        self,
        config: Config,
        *,
        consumers: Sequence[Consumer] = (),
        install_signal_handlers: bool = False,
        serve_ops: bool = False,
        sources: Sequence[SourceFactory] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._extra: list[Consumer] = list(consumers)
        self._signals = install_signal_handlers
        self._serve_ops = serve_ops
        self._ops_stack = contextlib.AsyncExitStack()
        self.ops: Services | None = None
        """The running operations services (bound address, registry), or ``None``."""
        self._source_factories = sources
        self._clock = clock
        self._engine: Engine | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._stop = asyncio.Event()
        self._changed = asyncio.Event()
        self._armed = asyncio.Event()
        self._rebuilt: set[str] = set()  # sources failed and being rebuilt: rescan again once each is armed
        self.watch = Watch()
        """The watch state (one value read by status, /readyz, /healthz, metrics and systemd)."""
        self._ready = False
        self._notify_soon: asyncio.AbstractEventLoop | None = None  # a run of _notify_now is scheduled there
        self._started = False
        self._closed = False
        self._lock: int | None = None
        self._live: dict[str, Source] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._private = PrivateDirs()  # plugins' own directories
        self._initial_done = False  # the initial pass latch readiness uses (see _initial_pass_done)
        self._trimmed_at: int | None = None  # engine.stats.handed_over at the last memory trim (None: none yet)
        self._trimmed_rescans = 0  # engine.stats.rescans at the last memory trim
        self._passed: set[tuple[str, str]] = set()  # (consumer, held path it went ahead without) already logged
        self._groups: dict[str, tuple[tuple[str, ...], ...]] = {}

    # Building ----------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        """Add an embedder's consumer object (before the reloader starts)."""
        if self._started:
            raise RuntimeError("add_consumer() must be called before the reloader starts")
        self._extra.append(consumer)

    # Lifecycle ---------------------------------------------------------------------
    async def __aenter__(self) -> Reloader:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Load plugins and state, start consumers and sources, queue the initial pass.

        Raises:
            RuntimeError: the reloader was closed; a closed reloader cannot be restarted
                (its state lock and consumers are gone): build a new one.
        """
        if self._closed:
            raise RuntimeError("this Reloader is closed and cannot be started again; create a new one")
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        try:
            if self._serve_ops:
                from ._ops._services import services  # prometheus-client (~5 MiB) only when ops are served

                await self._ops_stack.enter_async_context(services(self, notify_socket=""))
            elif self.ops is None and (self.config.metrics_listen or self.config.control_socket):
                log.warning(
                    "metrics_listen and control_socket are not served by an embedded Reloader; "
                    "pass serve_ops=True or wrap it in reloadd.ops_services(reloader)"
                )
            await self._start()
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        cfg = self.config
        if cfg.state_dir is not None:
            self._lock = await asyncio.to_thread(lock_state_dir, cfg.state_dir)
        built: list[tuple[Consumer, RecordStore, ConsumerConfig]] = []
        for cc in cfg.consumers:
            records = await asyncio.to_thread(records_for, cfg.state_dir, cc.name)
            private = await asyncio.to_thread(self._private.get, records, cc.name)
            consumer = await asyncio.to_thread(
                build_consumer, cc, records, private, cfg.source, self._trigger_for(cc.name),
                self._removal_held_for(cc.name), self._health_changed)
            built.append((consumer, records, cc))
        for consumer in self._extra:
            records = await asyncio.to_thread(records_for, cfg.state_dir, consumer.name)
            bind(consumer, records, self._trigger_for(consumer.name), self._removal_held_for(consumer.name),
                 self._health_changed)
            built.append((consumer, records, embedded_config(consumer)))
        names = [b[0].name for b in built]
        if len(set(names)) != len(names):
            raise ConfigError(f"consumer names must be unique, got {names}")
        check_after({c.name: conf.after for c, _, conf in built}, str(cfg.source or "<config>"))
        share_provisions(c for c, _, _ in built)
        agg = Aggregator(default=Timing(cfg.quiet, cfg.max_delay, max(cfg.max_hold, cfg.max_delay)))
        for consumer, _, conf in built:
            at_once = arrives_at_once(consumer)
            if conf.quiet is not None or conf.max_delay is not None or conf.max_hold is not None or at_once:
                max_delay = conf.max_delay if conf.max_delay is not None else cfg.max_delay
                agg.set_timing(consumer.name, Timing(
                    conf.quiet if conf.quiet is not None else cfg.quiet,
                    max_delay,
                    max(conf.max_hold if conf.max_hold is not None else cfg.max_hold, max_delay),  # never below
                    at_once,
                ))
        slots = [self._slot(c, r, cc) for c, r, cc in built]
        for slot in slots:
            await asyncio.to_thread(slot.queue.guard.load)
        self._engine = engine = Engine(slots, agg, clock=self._clock, on_change=self._notify,
                                       full_rescan_every=self.config.full_rescan_every,
                                       rescan_wait=self.config.rescan_interval)
        for slot in slots:
            try:
                await slot.consumer.start()
            except Exception as exc:
                log.error("Failed to start consumer %s: %s", slot.name, exc)
                raise
        for slot in slots:
            self._tasks.append(asyncio.create_task(slot.queue.run(), name=f"reloadd-queue-{slot.name}"))
        self._tasks.append(asyncio.create_task(self._supervise("pump", lambda ctx: Pump(engine)),
                                               name="reloadd-pump"))
        for name, factory in [*self._sources(), *self._far_side_sources(slots)]:
            self._tasks.append(asyncio.create_task(self._supervise(name, factory), name=f"reloadd-{name}"))
        if "inotify" in self.source_names:
            # Arm before the start-up walk: a change between the two is then seen by one of them.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._armed.wait(), 10.0)
        elif self._source_factories is None:
            self.watch = Watch(WatchState.RESCAN_ONLY, "inotify disabled")
        else:
            self.watch = Watch(WatchState.RESCAN_ONLY, "injected sources")
        engine.emit(SourceEvent(EventKind.RESCAN, None, "startup"))

    async def serve(self) -> None:
        """Run until :meth:`stop` is called, then shut down gracefully."""
        await self.start()
        try:
            await self._stop.wait()
        finally:
            await self.close()

    def run(self) -> None:
        """Synchronous :meth:`serve` for scripts (``asyncio.run`` under the hood)."""
        asyncio.run(self.serve())

    def stop(self) -> None:
        """Ask :meth:`serve` to return (safe from a signal handler and from other threads)."""
        self._call_in_loop(self._stop.set)

    async def close(self) -> None:
        """Stop sources, let in-flight work finish within the grace period, persist state."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        engine = self._engine
        pump_and_sources = [t for t in self._tasks if not t.get_name().startswith("reloadd-queue-")]
        for t in pump_and_sources:
            t.cancel()
        await asyncio.gather(*pump_and_sources, return_exceptions=True)
        if engine is not None:
            await asyncio.gather(
                *(s.queue.drain(self.config.shutdown_grace) for s in engine.slots.values()),
                return_exceptions=True,
            )
        queues = [t for t in self._tasks if t.get_name().startswith("reloadd-queue-")]
        for t in queues:
            t.cancel()
        await asyncio.gather(*queues, return_exceptions=True)
        if engine is not None:
            for slot in engine.slots.values():
                try:
                    await slot.consumer.close()
                except Exception as exc:
                    log.error("Failed to close consumer %s: %s", slot.name, exc)
        self.watch = Watch(WatchState.STOPPED)
        if self._lock is not None:
            os.close(self._lock)  # releases the flock
            self._lock = None
        await asyncio.to_thread(self._private.remove)
        await self._ops_stack.aclose()

    # Control -----------------------------------------------------------------------
    def trigger(self, paths: Iterable[str | Path] | None = None) -> None:
        """Hand paths (every path when ``None``) to their consumers again, forced.

        Thread-safe: from another thread the request is handed to the reloader's loop
        with ``call_soon_threadsafe``, which also wakes it.

        Raises:
            RuntimeError: the reloader has not been started, or is closed — a trigger
                then would be lost silently.
        """
        if self._closed:
            raise RuntimeError("trigger() called on a closed Reloader")
        if not self._started:
            raise RuntimeError("trigger() called before the Reloader started; use `async with Reloader(...)`")
        forced = None if paths is None else tuple(Path(p) for p in paths)
        self._call_in_loop(self._force, None, forced)

    async def confirm_prune(self, consumer: str | None = None) -> int:
        """Run the removals prune safety holds (every consumer's, or one's); returns how many.

        The operator's ``reloadd reload --confirm-prune``: each held removal is handed over
        with ``Change.prune_confirmed`` set, so a consumer's own limits let it through. Await it
        on the reloader's loop (from another thread: ``asyncio.run_coroutine_threadsafe``).

        Raises:
            RuntimeError: the reloader has not started, or is closed.
            KeyError: no consumer has that name.
        """
        if self._closed or self._engine is None:
            raise RuntimeError("confirm_prune() needs a running Reloader")
        slots = self._engine.slots
        if consumer is not None and consumer not in slots:
            raise KeyError(f"no consumer named {consumer!r} (have: {', '.join(sorted(slots))})")
        chosen = [slots[consumer]] if consumer is not None else list(slots.values())
        return sum(s.queue.confirm_prune() for s in chosen)

    def _notify(self) -> None:
        """Something changed: wake the waiters and re-check the queues, once per turn of the loop.

        The engine and the queues call this for every event and item (300k times in a burst
        of 100k files); one run per turn sees the same state.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._notify_now()
            return
        if self._notify_soon is loop:
            return
        self._notify_soon = loop
        loop.call_soon(self._notify_now)

    def _notify_now(self) -> None:
        self._notify_soon = None
        self._update_ready()
        self._changed.set()
        engine = self._engine
        if engine is not None:
            idle = engine.idle
            for slot in engine.slots.values():
                slot.queue.recheck()
                if idle:
                    slot.queue.tidy()  # a compaction a burst put off (one flag test when none is)
            since, stats = self._trimmed_at, engine.stats
            if idle and (stats.handed_over - since >= _TRIM_AFTER or stats.rescans != self._trimmed_rescans
                         if since is not None else self._ready):
                # The start-up pass, a burst or a rescan is over: give its memory back once it stays over (see
                # reloadd._pipeline._memory). After start-up too: what loading the plugins and the records freed stays
                # in the heap otherwise (the idle daemon: 47.1 MiB without this trim, 45.9 with it). After each
                # rescan: its walk's tables and strings, freed, stayed below the heap's trim threshold (the
                # daemon with 10,000 watched files: 56.6 MiB a minute in, 54.0 once trimmed; a trim ~0.2 ms).
                self._trimmed_at, self._trimmed_rescans = stats.handed_over, stats.rescans
                asyncio.get_running_loop().call_later(_TRIM_DELAY, self._give_back)

    def _give_back(self) -> None:
        engine = self._engine
        if engine is not None and engine.idle and self._loop is not None:
            engine.release_caches()  # the burst's digests and filter verdicts (~1 MiB a 10,000 paths)
            self._loop.run_in_executor(None, give_back)  # walks the heap: not on the loop

    def _update_ready(self) -> bool:
        if not self._ready and self._engine is not None and self._engine.startup_done.is_set():
            self._ready = self._engine.idle
        return self._ready

    @property
    def ready(self) -> bool:
        """The initial pass is done: every consumer was handed what it had to see at start."""
        return self._update_ready()

    @property
    def stop_requested(self) -> bool:
        """:meth:`stop` was called (or the reloader is closing)."""
        return self._stop.is_set()

    async def wait_stop_requested(self) -> None:
        """Wait until :meth:`stop` is called."""
        await self._stop.wait()

    @property
    def source_names(self) -> tuple[str, ...]:
        """Names of the sources this reloader runs (``inotify``, ``rescan``, ``signal`` or injected ones)."""
        return tuple(name for name, _ in self._sources())

    @property
    def watch_count(self) -> int:
        """Kernel watches held by this reloader's sources."""
        return sum(int(getattr(s, "watch_count", 0)) for s in self._live.values())

    def dead_tasks(self) -> list[str]:
        """Internal tasks that ended although the reloader is still running (for /healthz)."""
        if self._stop.is_set():
            return []
        return [t.get_name() for t in self._tasks if t.done()]

    @property
    def idle(self) -> bool:
        """Nothing waiting, held or in flight (retries in backoff count as waiting)."""
        return self._engine is not None and self._engine.idle

    async def wait_idle(self, timeout: float | None = None) -> None:
        """Wait until :attr:`idle` (raises ``TimeoutError`` after ``timeout`` seconds)."""
        async def _wait() -> None:
            while True:
                self._changed.clear()
                if self._engine is not None and self._engine.startup_done.is_set() and self.idle:
                    return
                await self._changed.wait()

        await asyncio.wait_for(_wait(), timeout)

    def status(self) -> dict[str, Any]:
        """The status document ``reloadd status --json`` prints: ``ready`` is what /readyz answers."""
        return self.snapshot(detail=True).status()

    def snapshot(self, detail: bool = False) -> Snapshot:
        """The pipeline now, for the operations services (see :mod:`reloadd._snapshot`).

        Args:
            detail: Also the per-path lists ``reloadd status`` shows (pending, failing, held...);
                without it only counts are taken (a scrape in a 100k-path burst lists nothing).
        """
        engine = self._engine
        if engine is None:
            return Snapshot(self.watch, ready_max_age=self.config.ready_max_age, dead_tasks=tuple(self.dead_tasks()))
        return pipeline_snapshot(engine, self.watch, ready=self._initial_pass_done(),
                                 ready_max_age=self.config.ready_max_age, dead_tasks=tuple(self.dead_tasks()),
                                 watch_count=self.watch_count, now=self._clock(), detail=detail)

    def _initial_pass_done(self) -> bool:
        """Every path found at start-up was handed over once, or waits for a retry (latched)."""
        if self._initial_done:
            return True
        engine = self._engine
        if engine is None:
            return False
        if self.ready:
            self._initial_done = True
            return True
        if not engine.startup_done.is_set() or engine.busy or not engine.inbox.empty() or engine.settling_total:
            return False
        for slot in engine.slots.values():
            counts = slot.queue.counts()
            if counts.first_tries or counts.untried:  # a retry in flight was handed over once already
                return False
        self._initial_done = True
        return True

    @property
    def watch_state(self) -> str:
        """The watch state as one line (``armed``, ``degraded (rescan-only): …``)."""
        return str(self.watch)

    @property
    def engine(self) -> Engine:
        """The running engine (for metrics and tests)."""
        if self._engine is None:
            raise RuntimeError("the reloader has not started")
        return self._engine
