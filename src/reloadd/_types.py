"""Values handed between the engine and consumers: changes, batches and results."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, TypeAlias

__all__ = [
    "Ack",
    "Batch",
    "Change",
    "ChangeKind",
    "DriftMode",
    "Fingerprint",
    "Hold",
    "JSONValue",
    "PathRecord",
    "Plan",
    "PlannedChange",
    "Reason",
    "Reject",
    "Result",
    "Retry",
]

JSONValue: TypeAlias = Any
"""Anything ``json.dumps`` accepts; a consumer's own per-path data."""


class ChangeKind(enum.StrEnum):
    """What happened to a path, as seen by its consumer."""

    ADDED = "added"
    """The path exists and the consumer has never acknowledged it."""

    MODIFIED = "modified"
    """The path exists and differs from what the consumer last acknowledged."""

    DELETED = "deleted"
    """The path is gone and the consumer had acknowledged (or been handed) it."""


class DriftMode(enum.StrEnum):
    """What a consumer does when its far-side sources see drift (the ``drift`` key of ``[[consumer]]``)."""

    CORRECT = "correct"
    """Hand the file that declared it over again (forced), with a backoff while something keeps undoing it."""

    DETECT = "detect"
    """Change nothing: one WARNING line, status, the metric (and what the plugin adds, e.g. an Event)."""

    OFF = "off"
    """Run no far-side source at all."""


class Reason(enum.StrEnum):
    """Why a batch was formed; exposed to ``exec`` commands as ``reason``.

    A batch handed over again without a change of its own is a *forced pass* (``Change.forced``; the
    engine's ``Force``); its reason says who asked: :attr:`SIGNAL`, :attr:`TRIGGER` or :attr:`DRIFT`.
    """

    STARTUP = "startup"
    """The initial pass: what changed while reloadd was not running."""

    INOTIFY = "inotify"
    """A kernel event was seen for the path."""

    RESCAN = "rescan"
    """The periodic (or overflow-triggered) stat walk found the change."""

    SIGNAL = "signal"
    """A forced pass an operator asked for: SIGHUP, ``reloadd reload`` or ``Reloader.trigger()``."""

    TRIGGER = "trigger"
    """A forced pass a consumer asked for itself (its ``ctx.trigger``: a ``.skip`` marker, a refresh)."""

    DRIFT = "drift"
    """A far-side source saw what the path declared change (an image removed, its pin stripped)."""


class Fingerprint(NamedTuple):
    """The stat identity of a file: inode, size, and modification/change times.

    The inode catches atomic renames and symlink retargets (a ConfigMap ``..data``
    swap), ctime catches writers that restore mtime. A named tuple, not a dataclass:
    100,000 of them are compared on every rescan, and tuple equality runs in C.
    """

    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def from_stat(cls, st: os.stat_result) -> Fingerprint:
        """Build a fingerprint from an ``os.stat`` result."""
        mtime, ctime = st.st_mtime_ns, st.st_ctime_ns
        # A file written and left alone has ctime == mtime: hold one int, not two equal ones (36 B a path).
        return tuple.__new__(cls, (st.st_ino, st.st_size, mtime, mtime if ctime == mtime else ctime))

    def to_json(self) -> list[int]:
        """A compact JSON form, ``[ino, size, mtime_ns, ctime_ns]``."""
        return list(self)

    @classmethod
    def from_json(cls, value: JSONValue) -> Fingerprint:
        """Inverse of :meth:`to_json`."""
        ino, size, mtime_ns, ctime_ns = (int(v) for v in value)
        return cls(ino, size, mtime_ns, mtime_ns if ctime_ns == mtime_ns else ctime_ns)


@dataclass(frozen=True, slots=True)
class Change:
    """One settled change of one path, handed to one consumer.

    Attributes:
        path: Absolute path as configured (symlinks inside the root not resolved).
        kind: Added, modified or deleted.
        fingerprint: The stat fingerprint at hand-over; ``None`` when deleted.
        digest: SHA-256 hex of the content when the engine computed it, else ``None``.
        forced: True when a resync asked for the path whatever its fingerprint.
        root: The configured root the path was found under.
        prune_confirmed: A person confirmed this held removal (``reloadd reload --confirm-prune``):
            run it, whatever a consumer's own limits (``max_prune``) say.
    """

    path: Path
    kind: ChangeKind
    fingerprint: Fingerprint | None
    digest: str | None = None
    forced: bool = False
    root: Path | None = None
    prune_confirmed: bool = False


_SET_CHANGE = tuple(Change.__dict__[name].__set__ for name in Change.__slots__)  # the slots' own setters


def new_change(path: Path, kind: ChangeKind, fingerprint: Fingerprint | None, digest: str | None, forced: bool,
               root: Path | None, prune_confirmed: bool) -> Change:
    """``Change(...)`` with every field given, built through the slots' setters: a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__`` (0.78 µs, one per delivered path; 0.43 this way)."""
    c: Change = object.__new__(Change)
    s_path, s_kind, s_fp, s_digest, s_forced, s_root, s_confirmed = _SET_CHANGE
    s_path(c, path)
    s_kind(c, kind)
    s_fp(c, fingerprint)
    s_digest(c, digest)
    s_forced(c, forced)
    s_root(c, root)
    s_confirmed(c, prune_confirmed)
    return c


@dataclass(frozen=True, slots=True)
class Batch:
    """The unit of delivery: settled changes for one consumer, one per path."""

    consumer: str
    reason: Reason
    changes: tuple[Change, ...]
    reporter: Callable[[Path, Result], None] | None = field(default=None, repr=False, compare=False)
    """Set by the engine; consumers call :meth:`report`, not this."""

    @property
    def paths(self) -> tuple[Path, ...]:
        """The paths of the changes, in batch order."""
        return tuple(c.path for c in self.changes)

    def report(self, path: Path, result: Result) -> None:
        """Settle one path before :meth:`Consumer.handle` returns.

        The result takes effect at once, as if ``handle()`` had returned it: an :class:`Ack` is
        recorded, and the path is free again, so a newer change to it is handed over in another
        batch while this one goes on (a slow file then delays no other file of its batch). The
        mapping ``handle()`` returns may leave the path out or repeat it; the first result
        stands. Paths not in this batch, and batches made outside the engine, ignore it.

        Safe from any thread (a consumer doing blocking work in ``asyncio.to_thread``): the
        result is handed to the engine's loop, where it takes effect before ``handle()``
        resumes. A report made after ``handle()`` returned or raised is ignored; the path
        never stays in flight.
        """
        if self.reporter is not None:
            self.reporter(path, result)


@dataclass(frozen=True, slots=True)
class Ack:
    """The consumer acted on the path; remember its fingerprint and ``data``."""

    data: JSONValue = None


@dataclass(frozen=True, slots=True)
class Retry:
    """Hand the path over again later.

    Attributes:
        error: Why (shown in status and logs).
        after: Seconds to wait before the next hand-over (a server's ``Retry-After``, a
            grace period); ``None`` uses the core's exponential backoff with jitter.
        failure: ``False`` for a deliberate wait that is not a failure (a removal held
            for a move's grace period): logged at DEBUG, listed as *deferred* in status,
            not counted as an attempt, and it does not hold back consumers ordered after
            this one.
    """

    error: str
    after: float | None = None
    failure: bool = True


@dataclass(frozen=True, slots=True)
class Reject:
    """A permanent failure: report it and do not retry until the file changes."""

    error: str
    data: JSONValue = None


@dataclass(frozen=True, slots=True)
class Hold:
    """Do not act on the path: keep its change held until a person confirms it or the path changes.

    For removals a consumer judges too large to run unasked (``kube-manifests``' ``max_prune``).
    The record stays as it was; the change waits outside the queue (it holds back no other path and
    no consumer ordered ``after`` this one), is listed under *prune held* in status and metrics, and
    is persisted, so a restart does not run it either. It is handed over again with
    ``Change.prune_confirmed`` after ``reloadd reload --confirm-prune``, or as an ordinary change when
    the file changes (a deleted file that comes back unchanged is simply released).

    Attributes:
        why: Shown in status and logs (``"3 files would prune 41 objects, over max_prune (10)"``).
    """

    why: str


Result: TypeAlias = Ack | Retry | Reject | Hold
"""What a consumer says about one path of a batch."""


@dataclass(frozen=True, slots=True)
class PathRecord:
    """What the engine remembers about a path for one consumer.

    Attributes:
        fingerprint: Fingerprint acknowledged last (``None`` if never acknowledged).
        digest: Content digest at that fingerprint, when computed.
        data: The consumer's own data from its last :class:`Ack` or :class:`Reject`.
        error: The last permanent error, if the last result was a :class:`Reject`.
    """

    fingerprint: Fingerprint | None
    digest: str | None = None
    data: JSONValue = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class PlannedChange:
    """One thing a consumer's next pass would change (``reloadd plan``).

    An input the pass would refuse is planned as action :data:`INVALID` (see :meth:`invalid`):
    ``reloadd plan`` then exits 1, naming the file and the cause, so a CI job gating on the plan
    stops a broken drop-in.

    Attributes:
        action: A verb: ``import``, ``pull``, ``unpin``, ``create``, ``update``, ``remove``, ``prune``...
            or ``invalid``.
        target: What it acts on: an image reference, a file, ``Kind namespace/name``.
        diff: A unified diff of the change when there is text to compare, else ``""``.
        detail: More JSON-able facts (digests, sizes), for ``--json``.
    """

    action: str
    target: str
    diff: str = ""
    detail: JSONValue = None

    INVALID: ClassVar[str] = "invalid"
    HELD: ClassVar[str] = "held"
    DRIFT: ClassVar[str] = "drift"

    @classmethod
    def drift(cls, what: str, why: str, kind: str = "", by: str = "") -> PlannedChange:
        """What a file declared has drifted on the far side (``reloadd plan`` lists it; a change, exit 2)."""
        return cls(cls.DRIFT, what, detail={"why": why, "kind": kind, "by": by})

    @classmethod
    def invalid(cls, path: Path | str, error: str) -> PlannedChange:
        """``path`` is an input the next pass would refuse, for ``error`` (the plan fails: exit 1)."""
        return cls(cls.INVALID, str(path), detail={"error": error})

    @classmethod
    def held(cls, path: Path | str, why: str) -> PlannedChange:
        """The removal of what ``path`` declared would be held by prune safety, for ``why`` (no change)."""
        return cls(cls.HELD, str(path), detail={"why": why})

    @property
    def is_held(self) -> bool:
        """Whether this entry reports a removal prune safety holds rather than a change."""
        return self.action == self.HELD

    @property
    def is_invalid(self) -> bool:
        """Whether this entry reports a refused input rather than a change."""
        return self.action == self.INVALID

    @property
    def line(self) -> str:
        """The human one-liner, ``"<action> <target>"`` (``invalid <file>: <error>`` for a refused input)."""
        if self.is_invalid and isinstance(self.detail, dict):
            return f"INVALID {self.target}: {self.detail.get('error')}"
        if self.is_held and isinstance(self.detail, dict):
            return (f"HELD {self.target}: {self.detail.get('why')} (prune safety; `reloadd reload --confirm-prune` "
                    "runs it)")
        if self.action == self.DRIFT and isinstance(self.detail, dict):
            by = f" by {self.detail['by']}" if self.detail.get("by") else ""
            kind = f"{self.detail['kind']} " if self.detail.get("kind") else ""
            return f"DRIFT {kind}{self.target}: {self.detail.get('why')}{by}"
        return f"{self.action} {self.target}"

    def to_json(self) -> dict[str, JSONValue]:
        """The JSON form ``reloadd plan --json`` prints."""
        out: dict[str, JSONValue] = {"action": self.action, "target": self.target}
        if self.diff:
            out["diff"] = self.diff
        if self.detail is not None:
            out["detail"] = self.detail
        return out


Plan: TypeAlias = Mapping[Path, Sequence[PlannedChange]]
"""What ``plan()`` returns: per path (an input, or a file the consumer writes), what would change.

A path mapped to an empty sequence would be handed over but change nothing.
"""
