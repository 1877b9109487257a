"""The pipeline as the operations services see it: a frozen :class:`~reloadd._snapshot.Snapshot` of an engine.

The facade's one reading of the engine, its queues, drift books and the consumers' own ``Reporting``; the ops
modules read the snapshot this builds and never the engine (see ``tests/core/test_architecture.py``).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from ._consumer import Consumer, HealthReporting, Reporting
from ._health import HealthReport
from ._pipeline._drift import DriftBook
from ._pipeline._engine import Engine
from ._pipeline._writers import writers_of
from ._snapshot import ConsumerSnapshot, EngineCounters, Snapshot
from ._watch import Watch

__all__ = ["pipeline_snapshot"]

_HELD_LISTED = 20  # paths held open listed in status (each costs a /proc scan)


def pipeline_snapshot(engine: Engine, watch: Watch, *, ready: bool, ready_max_age: float,
                      dead_tasks: tuple[str, ...], watch_count: int, now: float, detail: bool) -> Snapshot:
    """The pipeline now; ``detail`` adds the per-path lists ``reloadd status`` shows (else only counts)."""
    consumers = []
    for name, slot in engine.slots.items():
        q, st = slot.queue, slot.queue.stats
        counts = q.counts()
        held = q.held_removals()
        stats = slot.consumer.stats if isinstance(slot.consumer, Reporting) else None
        state = slot.records.health
        health = _health(slot.consumer)
        doc: dict[str, Any] | None = None
        if detail:
            doc = {
                "plugin": _plugin_of(slot.consumer),
                "roots": [str(r) for r in slot.filter.roots],
                "records": len(slot.records),
                "settling": engine.settling(name),
                "held": _held_status(engine, name),
                **q.status(),
                "note": _note(slot.consumer),
                "drift_mode": slot.drift.mode.value,
                "drift": _drift_status(slot.drift, now),
                "state": state.status(),
            }
            if health is not None:
                doc["health"] = _health_status(health, time.time())
        consumers.append(ConsumerSnapshot(
            name, _plugin_of(slot.consumer), tuple(str(r) for r in slot.filter.roots), len(slot.records),
            counts.rejected, engine.settling(name), counts.pending, counts.in_flight, counts.failing,
            counts.untried, q.oldest_age(), st.batches, st.acked, st.retried, st.rejected, st.dropped_unchanged,
            st.last_success, sum(h["size"] for h in held), len(held), len(engine.held_long(name)),
            stats=_numbers(stats), detail=doc, drift_mode=slot.drift.mode.value,
            drifted=len(slot.drift.drifted()), drift_total=dict(slot.drift.total), health=health,
            state_not_persisted=state.note(), state_write_errors=state.write_errors,
            state_unpersisted_seconds=state.seconds_since_success(), state_set_aside=state.set_aside_total,
        ))
    es = engine.stats
    counters = EngineCounters(dict(es.events), engine.agg.coalesced, es.handed_over, es.overflows, es.resyncs,
                              es.rescans, es.rescan_seconds, es.covered_rescans, es.recovery_delay,
                              rescans_waited=es.rescans_waited)
    return Snapshot(watch, True, ready, ready_max_age, dead_tasks, watch_count, tuple(consumers), counters)


def _held_status(engine: Engine, name: str) -> list[dict[str, Any]]:
    """Paths settling past max_delay (a file kept open, still growing), with the writers /proc names."""
    held = engine.held_long(name)[:_HELD_LISTED]
    writing = [path for path, why, _ in held if why == "open for writing"]
    pids = writers_of(writing) if writing else {}
    now = time.time()
    return [{"path": path, "why": why, "since": round(now - seconds, 3), "held_for": round(seconds, 3),
             "writers": pids.get(path, [])} for path, why, seconds in held]


def _note(consumer: Consumer) -> str | None:
    """A consumer's own one-line state for status (``status_note``, e.g. a standby's leader), if it has one."""
    try:
        if not isinstance(consumer, Reporting):  # may read the property (before Python 3.12)
            return None
        note = consumer.status_note
    except Exception as exc:  # a plugin bug must not break status
        return f"status_note failed: {exc}"
    return note if isinstance(note, str) else None


def _health(consumer: Consumer) -> HealthReport | None:
    """A consumer's :class:`~reloadd.HealthReporting` answer, if it gives one (a plugin bug: none)."""
    if not isinstance(consumer, HealthReporting):
        return None
    try:
        report = consumer.health()
    except Exception:  # a plugin bug must not break status
        return None
    return report if isinstance(report, HealthReport) else None


def _health_status(report: HealthReport, now: float) -> dict[str, Any]:
    """The ``health`` part of a consumer in ``reloadd status --json``."""
    return {
        "objects": dict(report.objects),
        "settling": report.settling,
        "files": [{"path": f.path, "state": f.state, "since": f.since, "for": round(max(0.0, now - f.since), 3),
                   "object": f.object, "reason": f.reason, "message": f.message, "wave": f.wave}
                  for f in report.files],
    }


def _drift_status(book: DriftBook, now: float) -> list[dict[str, Any]]:
    """The drift entries of ``reloadd status --json``."""
    return [
        {
            "path": e.path, "kind": e.drift.kind, "what": e.drift.what, "why": e.drift.why, "by": e.drift.by,
            "since": e.since, "events": e.events, "corrections": e.corrections, "fighting": e.fighting,
            "restored": e.restored, "next_correction_in": None if e.next_at is None else max(0.0, e.next_at - now),
        }
        for e in book.entries()
    ]


def _plugin_of(consumer: Consumer) -> str:
    return type(consumer).__module__.split(".")[0]


def _numbers(stats: object) -> dict[str, float]:
    """A plugin's ``stats`` as numbers (anything else left out)."""
    out: dict[str, float] = {}
    if isinstance(stats, dict):
        for key, value in stats.items():
            with contextlib.suppress(TypeError, ValueError):
                out[str(key)] = float(value)
    return out
