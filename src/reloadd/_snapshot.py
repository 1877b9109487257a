"""One frozen picture of the pipeline: what every operations service reads, and the one readiness rule.

``reloadd status``, ``/healthz``, ``/readyz``, ``/metrics``, systemd's ``STATUS=`` and the control
socket all read a :class:`Snapshot` taken from a :class:`Pipeline` (a :class:`~reloadd.Reloader`
satisfies it). None of them imports the reloader, the engine or a queue: a change there changes
how the snapshot is taken, in one place, not what the services read. Readiness is decided here, by
:meth:`Snapshot.readiness`, and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ._config import Config
from ._health import HealthReport
from ._watch import Watch

__all__ = ["ConsumerSnapshot", "EngineCounters", "Pipeline", "Snapshot"]


@dataclass(frozen=True, slots=True)
class ConsumerSnapshot:
    """One consumer at the moment of the snapshot (counts; ``detail`` carries the lists status shows).

    Attributes:
        detail: The status document's part for this consumer (paths pending, failing, held...),
            present only in a snapshot taken with ``detail=True``.
    """

    name: str
    plugin: str
    roots: tuple[str, ...] = ()
    records: int = 0
    rejected: int = 0
    settling: int = 0
    pending: int = 0
    in_flight: int = 0
    failing: int = 0
    untried: int = 0
    oldest_pending_age: float = 0.0
    batches: int = 0
    acked: int = 0
    retried: int = 0
    rejected_total: int = 0
    dropped_unchanged: int = 0
    last_success: float | None = None
    prune_held: int = 0
    """What held removals would remove (objects, images, files: the consumer's ``removal_unit``)."""
    prune_held_paths: int = 0
    held_paths: int = 0
    """Paths settling for longer than ``max_delay`` (a file kept open, still growing)."""
    drift_mode: str = "correct"
    drifted: int = 0
    """Files whose declared state has drifted and is not restored (yet: a fight, or ``detect`` mode)."""
    drift_total: Mapping[str, int] = field(default_factory=dict)
    """Drift events seen, per kind (``image``, ``object``, ``file``)."""
    stats: Mapping[str, float] = field(default_factory=dict)
    detail: Mapping[str, Any] | None = None
    state_not_persisted: str | None = None
    """``STATE NOT PERSISTED since …: <cause> (<path>)`` while writes of its state fail, else ``None``."""
    state_write_errors: int = 0
    """Writes of its state that failed since start."""
    state_unpersisted_seconds: float = 0.0
    """Seconds since its state was last persisted, while writes fail (0 while persisted)."""
    state_set_aside: int = 0
    """State files set aside as unreadable since start."""
    health: HealthReport | None = None
    """What the consumer says of the health of what it delivered (see :class:`~reloadd.HealthReporting`)."""


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """The engine's counters (events by source and kind, rescans, resyncs...)."""

    events: Mapping[tuple[str, str], int] = field(default_factory=dict)
    coalesced: int = 0
    handed_over: int = 0
    overflows: int = 0
    resyncs: int = 0
    rescans: int = 0
    rescan_seconds: float = 0.0
    covered_rescans: int = 0
    recovery_delay: float | None = None
    """Seconds from the last loss of events (an inotify overflow) to the start of its rescan."""
    rescans_waited: int = 0
    """Periodic rescans that fell due while paths were settling and waited for them to be handed over."""


@dataclass(frozen=True)
class Snapshot:
    """The pipeline at one moment.

    Attributes:
        watch: The watch state.
        started: The pipeline runs (its engine exists).
        initial_pass_done: Every path found at start-up was handed over at least once (or waits
            for a retry: one bad file must not keep a node unready for ever; ``ready_max_age``
            catches it if it stays bad). Latched: once true, true.
        ready_max_age: Seconds a path may wait before the node is not ready.
        dead_tasks: Internal tasks that ended while the pipeline still runs.
        watch_count: Kernel watches held.
        consumers: Per consumer, in configuration order.
        engine: The engine's counters (``None`` before it started).
    """

    watch: Watch
    started: bool = False
    initial_pass_done: bool = False
    ready_max_age: float = 600.0
    dead_tasks: tuple[str, ...] = ()
    watch_count: int = 0
    consumers: tuple[ConsumerSnapshot, ...] = ()
    engine: EngineCounters | None = None

    def readiness(self) -> tuple[bool, list[str]]:
        """Ready, and if not, why: the one rule ``/readyz``, metrics, status and systemd all use.

        Ready when the initial pass is done, the watch serves (armed, or degraded to rescans,
        which still converge), no consumer has a path waiting longer than ``ready_max_age``, and
        no consumer's state has gone unpersisted for longer than ``ready_max_age`` (a disk full or
        read-only for that long: the consumer still delivers, but a restart would hand everything
        since over again; a brief failure that the backoff retries away does not flap readiness).
        Held removals (prune safety) and held files do not make a node unready: it keeps working
        on its last good state, and the metrics make them loud.
        """
        problems: list[str] = []
        if not self.initial_pass_done:
            problems.append("initial pass not done")
        if not self.watch.serving:
            problems.append(f"watch {self.watch}")
        for c in self.consumers:
            if c.oldest_pending_age > self.ready_max_age:
                problems.append(f"consumer {c.name}: a path has waited {c.oldest_pending_age:.0f}s "
                                f"(ready_max_age {self.ready_max_age:g}s)")
            if c.state_not_persisted and c.state_unpersisted_seconds > self.ready_max_age:
                problems.append(f"consumer {c.name}: {c.state_not_persisted} "
                                f"(for {c.state_unpersisted_seconds:.0f}s, ready_max_age {self.ready_max_age:g}s)")
        return not problems, problems

    @property
    def ready(self) -> bool:
        """:meth:`readiness`, the verdict alone."""
        return self.readiness()[0]

    def totals(self) -> ConsumerSnapshot:
        """Every consumer's counts added up (for one-line summaries)."""
        return ConsumerSnapshot(
            "*", "*", pending=sum(c.pending for c in self.consumers), failing=sum(c.failing for c in self.consumers),
            rejected=sum(c.rejected for c in self.consumers),
            prune_held_paths=sum(c.prune_held_paths for c in self.consumers),
            held_paths=sum(c.held_paths for c in self.consumers),
            drifted=sum(c.drifted for c in self.consumers),
        )

    def status(self) -> dict[str, Any]:
        """The status document (`reloadd status --json`, `Reloader.status()`) of a snapshot taken with detail."""
        ready, problems = self.readiness()
        return {
            "watch": str(self.watch),
            "ready": ready,
            "ready_problems": problems,
            "consumers": {c.name: dict(c.detail or {}) for c in self.consumers},
        }


class Pipeline(Protocol):
    """What the operations services need of a running pipeline (:class:`~reloadd.Reloader` is one)."""

    config: Config
    ops: Any

    def snapshot(self, detail: bool = False) -> Snapshot:
        """The pipeline now; ``detail`` adds the per-path lists status shows."""
        ...

    def trigger(self, paths: Iterable[Any] | None = None) -> None:
        """Hand every path (or these) over again, forced."""
        ...

    async def confirm_prune(self, consumer: str | None = None) -> int:
        """Run the held removals; how many."""
        ...

    async def wait_idle(self, timeout: float | None = None) -> None:
        """Wait until nothing is waiting, held or in flight."""
        ...

    async def wait_stop_requested(self) -> None:
        """Wait until the pipeline is asked to stop."""
        ...

    @property
    def stop_requested(self) -> bool:
        """The pipeline was asked to stop."""
        ...
