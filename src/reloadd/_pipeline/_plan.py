"""``reloadd plan``: what every consumer's next pass would change, changing nothing.

The pending changes come from the engine's own rules: the start-up walk compared with
each consumer's acknowledged fingerprints (:func:`reloadd._pipeline._changes.diff`), then the
queue's de-duplication (:func:`reloadd._pipeline._changes.needed`, content digests included). The
records are read without the state lock and without writing anything, so a running
daemon is neither blocked nor disturbed; what it does meanwhile may make the plan stale.
Each consumer then says what handling that batch would change (:class:`~reloadd.Planner`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .._config import Config, ConsumerConfig
from .._consumer import Consumer, DriftPlanner, Planner
from .._errors import PlanUnsupportedError, ReloaddError
from .._filters import PathFilter
from .._state._records import RecordStore
from .._types import Batch, Change, ChangeKind, DriftMode, JSONValue, PlannedChange, Reason
from ._building import build_consumer, owner_test, path_filter
from ._changes import Needed, View, change_kind, diff, needed
from ._digests import DigestCache
from ._prune import PruneGuard
from ._scan import probe

__all__ = ["ConsumerPlan", "PlanReport", "pending_changes", "plan"]

log = logging.getLogger("reloadd.plan")


@dataclass(frozen=True)
class ConsumerPlan:
    """One consumer's part of a plan.

    Attributes:
        name: The consumer's name.
        plugin: The plugin that made it.
        pending: What the next pass would hand over.
        changes: Per path, what handling it would change.
        unsupported: Why the consumer cannot plan (its pending paths are still listed).
        error: Why planning failed.
    """

    name: str
    plugin: str
    pending: tuple[Change, ...] = ()
    changes: Mapping[Path, tuple[PlannedChange, ...]] = field(default_factory=dict)
    unsupported: str | None = None
    error: str | None = None

    @property
    def changed(self) -> bool:
        """Whether the consumer said it would change something (a refused input or a held removal is no change)."""
        return any(not c.is_invalid and not c.is_held for cs in self.changes.values() for c in cs)

    @property
    def invalid(self) -> list[tuple[str, str]]:
        """Inputs the next pass would refuse: (file, error)."""
        return [(c.target, str((c.detail or {}).get("error"))) for cs in self.changes.values() for c in cs
                if c.is_invalid]

    @property
    def status(self) -> str:
        """``error``, ``invalid``, ``cannot-plan``, ``changes`` or ``unchanged``."""
        if self.error is not None:
            return "error"
        if self.invalid:
            return "invalid"
        if self.unsupported is not None:
            return "cannot-plan"
        return "changes" if self.changed else "unchanged"

    def to_json(self) -> dict[str, JSONValue]:
        """The JSON form of ``reloadd plan --json``."""
        out: dict[str, JSONValue] = {"name": self.name, "plugin": self.plugin, "status": self.status}
        if self.error is not None:
            out["error"] = self.error
        if self.unsupported is not None:
            out["reason"] = self.unsupported
        if self.invalid:
            out["invalid"] = [{"path": p, "error": e} for p, e in self.invalid]
        out["pending"] = [{"path": str(c.path), "kind": c.kind.value} for c in self.pending]
        out["changes"] = {str(p): [c.to_json() for c in cs] for p, cs in sorted(self.changes.items()) if cs}
        return out

    def text(self) -> list[str]:
        """The human lines: a header, then per path the actions and their diffs, indented."""
        head = f"consumer {self.name} ({self.plugin}): "
        if self.error is not None:
            return [head + f"error: {self.error}"]
        if self.unsupported is not None:
            lines = [head + f"cannot plan: {self.unsupported}"]
            lines += [f"  would hand over: {c.kind.value} {c.path}" for c in self.pending]
            lines += [f"  {c.line}" for cs in self.changes.values() for c in cs if c.is_held]
            return lines
        if not self.changed and not self.invalid and not any(self.changes.values()):
            return [head + "nothing to change"]
        n = sum(1 for cs in self.changes.values() for c in cs if not c.is_invalid and not c.is_held)
        lines = [head + f"{n} change(s)" + (f", {len(self.invalid)} invalid input(s)" if self.invalid else "")]
        for path, cs in sorted(self.changes.items()):
            if not cs:
                continue
            lines.append(f"  {path}")
            for c in cs:
                lines.append(f"    {c.line}")
                lines += [f"      {d}" for d in c.diff.splitlines()]
        return lines


@dataclass(frozen=True)
class PlanReport:
    """Every consumer's plan, and the exit code of ``reloadd plan``."""

    consumers: tuple[ConsumerPlan, ...]

    @property
    def exit_code(self) -> int:
        """1 when any consumer failed to plan or has an input its pass would refuse, else 2 when any
        would change something, else 0.

        A consumer that cannot plan (``exec``) counts for neither: its pending paths are listed.
        """
        if any(c.error is not None or c.invalid for c in self.consumers):
            return 1
        return 2 if any(c.changed for c in self.consumers) else 0

    def to_json(self) -> dict[str, JSONValue]:
        """One JSON document for ``--json``."""
        return {
            "changes": any(c.changed for c in self.consumers),
            "exit_code": self.exit_code,
            "consumers": [c.to_json() for c in self.consumers],
        }

    def text(self) -> str:
        """The human report, grouped per consumer and path."""
        return "\n".join(line for c in self.consumers for line in c.text())


def pending_changes(consumer: Consumer, filt: PathFilter, records: RecordStore) -> tuple[Change, ...]:
    """What the next start-up pass would hand ``consumer`` (blocking: walks, stats and digests)."""
    jobs = [(str(root), str(root), filt.recursive) for root in filt.roots]
    view = View(consumer.name, filt, {}, records.packed, _nothing_queued, _nothing_settling)
    found = diff(jobs, [view], None, False)
    digests = DigestCache()
    out: list[Change] = []
    for key in found.observe.get(consumer.name, {}):
        path = Path(key)
        if key not in records.by_str and not (filt(path) and _accepts(consumer, path)):
            continue
        root = filt.root_of(path) or path.parent
        fp = probe(path, root).fingerprint
        digest = None
        if fp is not None and consumer.content_digest:
            with contextlib.suppress(OSError):  # unreadable: handed over without one, as the engine does
                digest = digests.digest(path, fp)
        rec = records.get(path)
        if needed(rec, fp, digest) is Needed.YES:
            out.append(Change(path, change_kind(rec, fp), fp, digest, False, root))
    return tuple(sorted(out, key=lambda c: c.path))


def _nothing_queued(key: str, default: object) -> object:
    """No queue beside a plan: nothing is queued or in flight."""
    return default


def _nothing_settling(key: tuple[str, str]) -> bool:
    """No aggregator beside a plan: nothing is settling."""
    return False


def _accepts(consumer: Consumer, path: Path) -> bool:
    """``consumer.accepts`` as the engine calls it: raising counts as ``False``."""
    try:
        return bool(consumer.accepts(path))
    except Exception as exc:
        log.error("Failed to filter %s in consumer %s: %s", path, consumer.name, exc)
        return False


async def plan(config: Config) -> PlanReport:
    """Plan every configured consumer in turn; a failing one does not stop the others."""
    import tempfile  # with shutil, 0.9 MiB of modules: only for a plan

    with tempfile.TemporaryDirectory(prefix="reloadd-plan-") as scratch:
        return PlanReport(tuple([await _plan_one(config, cc, Path(scratch)) for cc in config.consumers]))


async def _plan_one(config: Config, cc: ConsumerConfig, scratch: Path) -> ConsumerPlan:
    base = ConsumerPlan(cc.name, cc.plugin)
    records = RecordStore(config.state_dir / "consumers" / cc.name if config.state_dir is not None else None)
    guards: list[PruneGuard] = []  # bound once the consumer (its filter) exists

    def removal_held(path: Path) -> str | None:
        return guards[0].removal_held(path) if guards else None

    try:
        await asyncio.to_thread(records.load, read_only=True)
        consumer = build_consumer(cc, records, _private_dir(records, scratch / cc.name), config.source,
                                  removal_held=removal_held)
    except ReloaddError as exc:
        return _failed(base, str(exc))
    try:
        filt = path_filter(consumer, cc)
        guard = PruneGuard(filt, records.by_str, owner_test(consumer, filt), records.directory)
        await asyncio.to_thread(guard.load, read_only=True)  # reads prune.json, writes nothing
        guards.append(guard)
        pending = await asyncio.to_thread(pending_changes, consumer, filt, records)
        # Removals prune safety would hold are not planned as removals: they are listed as held.
        held = await asyncio.to_thread(guard.check, [str(c.path) for c in pending if c.kind is ChangeKind.DELETED])
        kept = tuple(c for c in pending if str(c.path) not in held)
        holds = {Path(k): (PlannedChange.held(k, why),) for k, why in held.items()}
        base = ConsumerPlan(cc.name, cc.plugin, kept, holds)
        if not isinstance(consumer, Planner):
            return _unsupported(base, f"{type(consumer).__name__} has no plan()")
        try:
            result = await consumer.plan(Batch(cc.name, Reason.STARTUP, kept))
        except PlanUnsupportedError as exc:
            return _unsupported(base, str(exc))
        except ReloaddError as exc:
            return _failed(base, str(exc))
        except Exception as exc:
            log.error("Failed to plan consumer %s: %s", cc.name, exc, exc_info=exc)
            return _failed(base, f"{type(exc).__name__}: {exc}")
        changes = {Path(p): tuple(cs) for p, cs in result.items()}
        if isinstance(consumer, DriftPlanner) and cc.drift is not DriftMode.OFF:
            # Files the pass leaves alone may still have drifted on the far side: list that too.
            pending_paths = {c.path for c in kept} | set(holds)
            steady = sorted(p for p in records if p not in pending_paths)
            try:
                drifted = await consumer.plan_drift(steady)
            except ReloaddError as exc:
                return _failed(base, f"checking drift: {exc}")
            for p, cs in drifted.items():
                changes[Path(p)] = (*changes.get(Path(p), ()), *cs)
        return ConsumerPlan(cc.name, cc.plugin, kept, {**changes, **holds})
    finally:
        try:
            await consumer.close()
        except Exception as exc:
            log.error("Failed to close consumer %s: %s", cc.name, exc)


def _private_dir(records: RecordStore, scratch: Path) -> Path:
    """The plugin's own directory when the daemon made one (read-only by contract), else a scratch one."""
    if records.directory is not None and (records.directory / "plugin").is_dir():
        return records.directory / "plugin"
    scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
    return scratch


def _failed(base: ConsumerPlan, error: str) -> ConsumerPlan:
    return ConsumerPlan(base.name, base.plugin, base.pending, error=error)


def _unsupported(base: ConsumerPlan, why: str) -> ConsumerPlan:
    return ConsumerPlan(base.name, base.plugin, base.pending, base.changes, unsupported=why)
