"""The state every part of the ``kube-manifests`` consumer shares, and which files the consumer takes.

:class:`~reloadd_kube_manifests.KubeManifestsConsumer` is composed of parts (see ``_parts``), each a mixin
over :class:`ConsumerBase`: the attributes are built once here (``__init__``), and the calls one part makes
into another are declared here as abstract methods, so each part typechecks alone and a part that stops
providing one is a type error, not an ``AttributeError`` at run time.
"""

from __future__ import annotations

import abc
import asyncio
import os
from collections import deque
from pathlib import Path

from reloadd import BaseConsumer, Change, ConsumerContext, DriftMode, unchanged

from .._apply import Applier
from .._applyset import ObjRef
from .._client import KubeClient
from .._discovery import Discovery
from .._gate import Gate
from .._health import FileHealthState, FileState, HealthBook
from .._lease import LeaderElector
from .._ledger import Ledger
from .._moves import MoveGrace
from .._settings import Settings
from .._watch import ObjectWatch

__all__ = ["APPLY_FAILED", "SKIP_SUFFIX", "SUFFIXES", "ConsumerBase"]

SUFFIXES = frozenset({".yaml", ".yml", ".json"})
SKIP_SUFFIX = ".skip"
APPLY_FAILED = "ApplyFailed"
"""The reason of a file failed because the server refused some of it (not a health verdict)."""


def _marked(path: Path) -> bool:
    """Whether ``path`` has a ``.skip`` marker beside it.

    No ``Path`` is built for the marker (one per file of every batch): pathlib interns every name it parses.
    """
    return os.path.exists(os.fspath(path) + SKIP_SUFFIX)


class ConsumerBase(BaseConsumer):
    """The state the parts share, the selection of files, and the calls between parts.

    Args:
        ctx: The engine's context.
        settings: Validated options.
    """

    def __init__(self, ctx: ConsumerContext, settings: Settings) -> None:
        super().__init__(ctx)
        self.settings = settings
        self._removed: deque[tuple[float, int]] = deque()  # (when, objects) of removals run lately
        self._limit_held: set[Path] = set()  # deleted files held by max_prune
        self.concurrency = settings.concurrency
        self.client: KubeClient | None = None
        self.discovery: Discovery | None = None
        self.applier: Applier | None = None
        self._discovered = False
        self._ready_lock = asyncio.Lock()
        self._warned: dict[Path, str] = {}  # content hash whose server warnings were reported, per file
        self._retrying: dict[Path, int] = {}  # consecutive transient results per file
        self._resync: asyncio.Task[None] | None = None
        self._moves = MoveGrace(settings.move_grace, ctx.trigger)
        self.ledger = Ledger(settings.field_manager, on_change=self._members_changed)
        self._watch: ObjectWatch | None = None
        self._ledger_loaded = False
        self.elector: LeaderElector | None = None
        self._electing: asyncio.Task[None] | None = None
        self._foreign_task: asyncio.Task[None] | None = None
        self.foreign: list[tuple[str, str]] = []
        """ApplySets of this consumer whose file this folder lacks: (key, parent name)."""
        self._files = asyncio.Semaphore(settings.concurrency)  # files applied at once, across batches
        self.stats: dict[str, float] = {
            "files_applied": 0, "files_removed": 0, "files_failed": 0, "removals_deferred": 0,
            "objects_applied": 0, "objects_pruned": 0, "api_requests": 0, "api_retries": 0, "api_dropped": 0,
            "files_health_failed": 0, "files_waited_for_provider": 0,
        }
        self._gate = Gate(settings.crd_timeout)
        self._book = HealthBook(settings.health_timeout, on_change=self._health_moved)
        self._tracking = not settings.dry_run and ctx.drift is not DriftMode.OFF
        """Health comes from the ``kube-watch`` source: without it (``drift = "off"``, ``dry_run``) a file is current
        once applied, as before health tracking."""
        self._event_tasks: set[asyncio.Task[None]] = set()
        self._health_failed: set[Path] = set()  # files failed by health (not a refused apply): recovery is logged
        self._waves: dict[Path, int] = {}  # files in a wave other than 0 (reloadd.io/wave)
        self._wave_pending: dict[Path, int] = {}  # files handed over and not applied yet, by wave
        self._wave_moved = asyncio.Event()  # a file's health changed or a pending file was applied

    # --- selection -----------------------------------------------------------------------------------
    def _rel(self, path: Path) -> str | None:
        """``path`` relative to the root it lies under, as text (``""``: a root itself; ``None``: under none).

        Text, not ``Path.relative_to``: that parses a new ``Path`` and interns each of its names, and the
        interpreter's table of interned strings, grown by a 10,000-file pass, never shrinks.
        """
        text = os.fspath(path)
        for root in self.roots:
            r = os.fspath(root)
            if text == r:
                return ""
            if text.startswith(r if r.endswith("/") else r + "/"):
                return text[len(r) + (not r.endswith("/")):]
        return None

    def _hidden(self, path: Path) -> bool:
        rel = self._rel(path) or path.name
        return any(part.startswith(".") for part in rel.split("/"))

    def accepts(self, path: Path) -> bool:
        """Manifests (``.yaml``/``.yml``/``.json``) and ``.skip`` markers, outside dotfiles."""
        if self._hidden(path):
            return False
        suffix = path.suffix.lower()
        if suffix == SKIP_SUFFIX:
            return _suffix(path.stem).lower() in SUFFIXES
        return suffix in SUFFIXES

    def key(self, path: Path) -> str:
        """The stable identity of a file's ApplySet: consumer name and path relative to its root."""
        return f"{self.name}:{self._rel(path) or path.name}"

    def _present_files(self) -> list[Path]:
        out = []
        for root in self.roots:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                out += [p for f in filenames if self.accepts(p := Path(dirpath) / f)]
        return out

    def _unchanged(self, change: Change) -> bool:
        """The test :meth:`_one` makes before applying: the content applied last, without errors (the core's record)."""
        record = self.ctx.records.get(change.path)
        return unchanged(change, record) and record is not None and isinstance(record.data, dict)

    # --- calls one part makes into another (defined by the part named) -------------------------------
    @abc.abstractmethod
    async def _ready(self) -> Applier:
        """Connect and discover once, for every batch at once; the applier (``_consumer``)."""

    @abc.abstractmethod
    async def _connect(self, elect: bool = True) -> None:
        """Load the kubeconfig and build the clients, with ``elect`` the Lease's too (``_consumer``)."""

    @abc.abstractmethod
    def _standing_by(self) -> bool:
        """Whether another process holds the Lease (``lease``)."""

    @abc.abstractmethod
    def _members_changed(self) -> None:
        """The ledger's members changed: the watch looks again (``drift``)."""

    @abc.abstractmethod
    def _settled(self, path: Path) -> None:
        """``path``'s apply or removal answered (``drift``)."""

    @abc.abstractmethod
    def _health_moved(self, path: Path, old: FileState | None, f: FileHealthState) -> None:
        """A file's health changed (``health``)."""

    @abc.abstractmethod
    async def _move_wait(self, applier: Applier, path: Path, claimed: set[ObjRef]) -> float:
        """Seconds the removal of deleted ``path`` still waits for the other half of a move (``prune``)."""


def _suffix(name: str) -> str:
    """``Path(name).suffix`` of a file name, without building the ``Path``."""
    i = name.rfind(".")
    return name[i:] if 0 < i < len(name) - 1 else ""
