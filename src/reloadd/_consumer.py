"""The consumer plug-in contract.

A plugin is a distribution that declares, in the ``reloadd.consumers`` entry-point
group, a *factory*: a callable taking a :class:`ConsumerContext` and returning an
object satisfying :class:`Consumer`. Built-in plugins are registered exactly the
same way::

    [project.entry-points."reloadd.consumers"]
    exec = "reloadd_exec:create"

The engine owns everything around ``handle``: settling, de-duplication, one batch
in flight per path, retries with backoff, persistence of acknowledged fingerprints
and of the consumer's own per-path data.

A consumer may also be a :class:`Planner`: ``reloadd plan`` then asks it what its
next pass would change, without changing it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ._errors import PlanUnsupportedError
from ._health import HealthReport
from ._outcomes import result_of
from ._provides import Provision
from ._source import Source, SourceContext
from ._types import Batch, Change, DriftMode, PathRecord, Plan, Result

__all__ = [
    "BaseConsumer", "Consumer", "ConsumerContext", "ConsumerFactory", "DriftPlanner", "HealthReporting", "Planner",
    "PruneAware", "Reporting", "SourceProvider", "Tunable",
]


@runtime_checkable
class Consumer(Protocol):
    """What the engine needs from a consumer.

    Attributes:
        name: The consumer's configured name (unique in a reloader).
        roots: Files or directories to watch. Directories are watched recursively.
        content_digest: When true (the default in :class:`BaseConsumer`), a change
            where only times moved is checked against a SHA-256 of the content and
            dropped if equal. Consumers of multi-GB files may set it false.
        concurrency: How many batches may be in flight at once.
    """

    name: str
    roots: Sequence[Path]
    content_digest: bool
    concurrency: int

    def accepts(self, path: Path) -> bool:
        """Whether ``path`` (a regular file under a root) is this consumer's business."""
        ...

    async def start(self) -> None:
        """Connect to whatever the consumer drives; called once before any batch."""
        ...

    async def handle(self, batch: Batch) -> Mapping[Path, Result]:
        """Act on a batch; return a result per path.

        A path missing from the returned mapping counts as acknowledged with its
        previous data kept. Raising is mapped by the engine, per path:
        :class:`~reloadd.PermanentError` rejects the path (its previous data kept)
        until the file changes, anything else retries it with backoff. When a batch
        of several paths raises, each path is handed over again alone, so one bad
        path never fails the others. The :class:`~reloadd.ConsumerError` tree is
        logged as one WARNING line (traceback at DEBUG); any other exception is
        treated as a bug and logged at ERROR with its traceback.
        """
        ...

    async def close(self) -> None:
        """Release resources; called once on shutdown."""
        ...


@runtime_checkable
class Planner(Protocol):
    """The optional half of the contract ``reloadd plan`` uses (kept apart so a consumer without it still is one)."""

    async def plan(self, batch: Batch) -> Plan:
        """Say what handling ``batch`` would change, changing nothing.

        ``batch`` holds what the next pass would hand over (the same walk and records
        comparison the engine makes at start-up), possibly nothing: a consumer that
        reconciles everything at :meth:`Consumer.start` reports that part too. The
        consumer has *not* been started (``start`` may act): connect read-only here,
        release in ``close()``, which is called afterwards. Write nothing, neither to
        the system it drives nor to ``ctx.state_dir``.

        Raises:
            PlanUnsupportedError: it cannot tell (the consumer is reported as such).
            ReloaddError: it could not find out (the plan fails, exit code 1).
        """
        ...


@runtime_checkable
class PruneAware(Protocol):
    """The optional half of the contract prune safety uses: what a held removal amounts to.

    Attributes:
        removal_unit: What :meth:`removal_size` counts, for status (``objects``, ``images``...).
    """

    removal_unit: str

    def removal_size(self, record: PathRecord) -> int:
        """How many things removing the path of ``record`` would remove (pure: from its data)."""
        ...

    async def removals_held(self, paths: Sequence[Path], why: str) -> None:
        """Removals of these paths were just held (the engine logged one WARNING): report them further."""
        ...


@runtime_checkable
class Reporting(Protocol):
    """The optional half of the contract status and metrics read: a consumer's own counters and state.

    Attributes:
        stats: Counters, name → number (``images_imported``, ``files_failed``...): ``reloadd status
            --json`` lists them and /metrics exports each as ``reloadd_consumer_stat{consumer,stat}``;
            values that are not numbers are left out. A stat named ``metric{label=value}`` is exported as a
            family of its own, ``reloadd_<metric>{consumer,label}`` (a counter when ``metric`` ends in
            ``_total``, else a gauge): ``images_refused_total{reason=bad_signature}`` is
            ``reloadd_images_refused_total{consumer="…",reason="bad_signature"}``.
        status_note: One line of the consumer's own state, shown by status as ``state:`` (a standby's
            leader), or ``None``. Read on every status request: keep it cheap; an exception is shown
            as the note instead.
    """

    stats: Mapping[str, float]

    @property
    def status_note(self) -> str | None:
        """The consumer's own one-line state, or ``None``."""
        ...


@runtime_checkable
class HealthReporting(Protocol):
    """The optional half of the contract for consumers that know whether what they delivered is *done*.

    An acknowledged path is applied; whether it then became healthy is the consumer's to say (a
    Deployment whose pods never become ready was accepted all the same). Status, ``--json`` and
    ``/metrics`` show :meth:`health`; consumers ordered ``after`` this one wait while it reports
    :attr:`~reloadd.HealthReport.settling` (call :attr:`ConsumerContext.health_changed` when that may
    have changed, so they look again).
    """

    def health(self) -> HealthReport:
        """The health now (read on every status request and scrape: keep it cheap)."""
        ...


class Tunable(Protocol):
    """What an embedder's consumer object may declare instead of a ``[[consumer]]`` table (each optional).

    The core reads each attribute that is present (one place: ``reloadd._pipeline._building.embedded_config``)
    and falls back to the table's default: ``include``, ``exclude`` (globs), ``recursive``,
    ``ignore_defaults``, ``quiet``, ``max_delay``, ``max_hold`` (seconds or ``"2s"``), ``after``
    (consumer names), ``group`` (globs, lists of globs, or a callable ``Path -> str | None``) and
    ``drift`` (a :class:`~reloadd.DriftMode`; else its context's).
    """

    include: Sequence[str]
    exclude: Sequence[str]
    recursive: bool
    ignore_defaults: bool
    quiet: float | str
    max_delay: float | str
    max_hold: float | str
    after: Sequence[str]
    group: Sequence[str | Sequence[str]] | Callable[[Path], str | None]
    drift: DriftMode


@runtime_checkable
class DriftPlanner(Protocol):
    """The optional half of the contract ``reloadd plan`` uses to show drift (guarded state).

    Read-only, like :meth:`Planner.plan`: what the far side holds now, compared with what the
    recorded files declared.
    """

    async def plan_drift(self, paths: Sequence[Path]) -> Plan:
        """Per recorded file of ``paths`` whose declared state drifted: :meth:`PlannedChange.drift` entries."""
        ...


@runtime_checkable
class SourceProvider(Protocol):
    """The optional half of the contract for consumers that watch what they produced (guarded state).

    A far-side source (containerd's event stream, a Kubernetes watch) is a :class:`~reloadd.Source`
    like inotify's: the core runs it under the same supervisor (rebuilt after any failure, with
    backoff), and it only emits :class:`~reloadd.SourceEvent` values. A ``DRIFTED`` event naming a
    path and this consumer hands the path over again, forced, with ``Reason.DRIFT``: settling, the
    work queue, retries, status and metrics apply unchanged.
    """

    def sources(self) -> Sequence[Callable[[SourceContext], Source]]:
        """Factories of this consumer's far-side sources, called once the consumer has started."""
        ...


@dataclass
class ConsumerContext:
    """Everything a factory gets to build a consumer.

    Attributes:
        name: The consumer's configured name.
        paths: The ``paths`` of its ``[[consumer]]`` table, absolute.
        options: The raw ``[consumer.options]`` table; validate it with
            :class:`reloadd.Options`.
        state_dir: A private directory (0700) for the consumer's own files.
        records: What the engine remembers per path (read-only view, kept current).
        trigger: Ask the engine to hand over these paths again, forced
            (``None`` means every path the consumer owns).
        logger: The consumer's logger (``reloadd.consumer.<name>``).
        config_file: The configuration file, for error messages.
        removal_held: Why removing what a recorded path declared must not run now (its
            input looks lost: see "prune safety"), or ``None``. For consumers that act on
            every input at once rather than per change; may stat, so call it off the loop.
        drift: The consumer's ``drift`` mode: ``off`` starts none of its far-side sources
            (:class:`SourceProvider`); ``detect`` hands nothing over for drift, so a source may
            report it further (a Kubernetes Event), but must change nothing.
        health_changed: Tell the core the consumer's :class:`HealthReporting` answer changed.
        provided: What the other consumers of this reloadd provide of a kind (``"image"``): their
            :class:`~reloadd.Providing` entries, read when asked (``()`` when none provides it).
    """

    name: str
    paths: tuple[Path, ...]
    options: Mapping[str, Any]
    state_dir: Path
    records: Mapping[Path, PathRecord] = field(default_factory=dict)
    trigger: Callable[[Iterable[Path] | None], None] = lambda paths: None
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("reloadd.consumer"))
    config_file: Path | None = None
    removal_held: Callable[[Path], str | None] = lambda path: None
    drift: DriftMode = DriftMode.CORRECT
    health_changed: Callable[[], None] = lambda: None
    """Tell the core the consumer's :class:`HealthReporting` answer changed (its ``after`` dependents look again)."""
    provided: Callable[[str], tuple[Provision, ...]] = lambda kind: ()
    """What the other consumers provide of ``kind`` (see :class:`~reloadd.Providing`)."""


ConsumerFactory = Callable[[ConsumerContext], Consumer]
"""The object an entry point in ``reloadd.consumers`` names."""


class BaseConsumer:
    """Convenience base: defaults for everything but :meth:`handle` (or :meth:`handle_one`).

    It implements every optional half of the contract (:class:`Planner`, :class:`PruneAware`,
    :class:`SourceProvider`, :class:`Reporting`) with a neutral default.

    Subclasses set ``name`` and ``roots`` (usually from the context) and override
    :meth:`accepts`, :meth:`start` and :meth:`close` as needed.
    """

    content_digest: bool = True
    concurrency: int = 1
    arrival_at_once: bool = False
    """Hand over a complete file moved into a root (``EventKind.ARRIVED``) without waiting for ``quiet``, when
    nothing else happened to it: for files that stand alone (image archives), not for files that go together
    (a key and its certificate, manifests renamed in one after another), which the quiet period gathers."""
    removal_unit: str = "files"
    name_path_in_errors: bool = False
    """Start the error of a path whose handling raised with the path itself (see :func:`reloadd.result_of`)."""

    def __init__(self, ctx: ConsumerContext) -> None:
        self.ctx = ctx
        self.name = ctx.name
        self.roots: Sequence[Path] = ctx.paths
        self.log = ctx.logger
        self.stats: dict[str, float] = {}
        """Counters for status and metrics (see :class:`Reporting`): set your own."""

    @property
    def status_note(self) -> str | None:
        """No state of its own to show by default (see :class:`Reporting`)."""
        return None

    def accepts(self, path: Path) -> bool:
        """Accept every file; override to narrow."""
        return True

    async def start(self) -> None:
        """Nothing to connect to by default."""

    def removal_size(self, record: PathRecord) -> int:
        """One file per path by default (see :class:`PruneAware`)."""
        return 1

    async def removals_held(self, paths: Sequence[Path], why: str) -> None:
        """Nothing more than the engine's WARNING by default (see :class:`PruneAware`)."""

    def sources(self) -> Sequence[Callable[[SourceContext], Source]]:
        """No far-side sources by default (see :class:`SourceProvider`)."""
        return ()

    async def handle(self, batch: Batch) -> Mapping[Path, Result]:
        """Hand each change of the batch to :meth:`handle_one`, all at once, and report each as it settles.

        The per-path fan-out every per-file consumer needs, done once here: a path whose
        ``handle_one()`` raised gets the core's result for the exception (``PermanentError``
        rejects, anything else retries; see :func:`reloadd._outcomes.result_of`) and the others
        go on; each path is reported (:meth:`Batch.report`) as soon as it is done, so a slow
        one delays no other. Limit how many run at once in ``handle_one`` if that matters.
        Consumers that act on a batch as a whole override this instead.
        """
        return await self.each(batch, batch.changes, self.handle_one)

    async def each(self, batch: Batch, changes: Sequence[Change], act: Callable[[Change], Awaitable[Result]], *,
                   at_once: bool = True, limit: int | None = None) -> dict[Path, Result]:
        """Run ``act`` on each of ``changes`` (of ``batch``), all at once or one after another.

        The core's per-path fan-out, for :meth:`handle` and for a consumer whose ``handle()``
        orders its batch in phases (applies before removals, say): what ``act`` raises becomes
        the path's result by the core's one policy (:func:`reloadd._outcomes.result_of`), and
        each path is reported (:meth:`Batch.report`) as soon as it is done. With ``limit``, at most
        that many run at once (each of ``limit`` workers takes the next change when it is done),
        so a batch of thousands of paths never holds a task per path while they wait for a turn.
        """
        async def one(change: Change) -> Result:
            try:
                result = await act(change)
            except Exception as exc:
                result = result_of(exc, self.name, change.path, name_path=self.name_path_in_errors)
            batch.report(change.path, result)
            return result

        if not at_once:
            results = [await one(c) for c in changes]
        elif limit is None or limit >= len(changes):
            results = await asyncio.gather(*(one(c) for c in changes))
        else:
            done: list[Result | None] = [None] * len(changes)
            todo = iter(enumerate(changes))

            async def worker() -> None:
                for i, change in todo:
                    done[i] = await one(change)

            await asyncio.gather(*(worker() for _ in range(max(1, limit))))
            results = [r for r in done if r is not None]
        return {c.path: r for c, r in zip(changes, results, strict=True)}

    async def handle_one(self, change: Change) -> Result:
        """Act on one change (used by the default :meth:`handle`); override this or :meth:`handle`."""
        raise NotImplementedError(f"{type(self).__name__} implements neither handle() nor handle_one()")

    async def plan(self, batch: Batch) -> Plan:
        """Cannot plan unless overridden (see :class:`Planner`).

        Raises:
            PlanUnsupportedError: always.
        """
        raise PlanUnsupportedError(f"{type(self).__name__} does not implement plan()")

    async def close(self) -> None:
        """Nothing to release by default."""
