"""The source contract: an async producer of :class:`SourceEvent` values.

A source is registered in the ``reloadd.sources`` entry-point group as a class (or
factory) taking a :class:`SourceContext`; the engine calls ``await source.run()`` under
its supervisor and cancels it to stop. Sources only *report*; every decision (which
consumer, settled or not, changed or not) is the aggregator's.
"""

from __future__ import annotations

import enum
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

__all__ = ["Coverage", "Drift", "EventKind", "Source", "SourceContext", "SourceEvent", "WatchRoot"]


class EventKind(enum.Enum):
    """What a source saw."""

    # Members are singletons compared by identity: hash them by identity too, in C (``Enum.__hash__``
    # is a Python call, and every file event is hashed a few times on its way through the engine).
    __hash__ = object.__hash__

    WRITING = "writing"
    """A writer is at work on the file (IN_MODIFY): hold it."""

    WRITTEN = "written"
    """A writer finished (IN_CLOSE_WRITE)."""

    ARRIVED = "arrived"
    """A complete file was moved into place (IN_MOVED_TO): for a consumer with ``arrival_at_once``, if nothing
    else happened to the path since it was last handed over, it is handed over without waiting for ``quiet``."""

    GONE = "gone"
    """The file was deleted or moved away."""

    TOUCHED = "touched"
    """Something happened that says nothing about writers (create, chmod)."""

    SUBTREE = "subtree"
    """Re-examine everything under ``path`` (a new, moved or swapped directory)."""

    RESCAN = "rescan"
    """Re-examine every root (periodic walk, queue overflow, lost watch)."""

    RESYNC = "resync"
    """Hand every path to its consumer again, forced (SIGHUP)."""

    DRIFTED = "drifted"
    """What ``path`` declared changed on the far side (an image removed, an object edited): hand the
    path over again, forced, to ``consumer`` (or to every consumer that owns or recorded it)."""


@dataclass(frozen=True, slots=True)
class Drift:
    """What a far-side source saw move away from what a file declared (the detail of a ``DRIFTED`` event).

    Attributes:
        kind: What moved, for the metric's ``kind`` label: ``image``, ``object``, ``file``...
        what: The thing itself, as an operator names it (an image name, ``apps/Deployment default/web``,
            a hosts.toml path).
        why: What happened to it (``deleted``, ``unpinned``, ``spec.replicas changed``...).
        by: Who did it, when the far side says (a Kubernetes field manager), else ``""``.
    """

    kind: str
    what: str
    why: str
    by: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.what}: {self.why}" + (f" by {self.by}" if self.by else "")


@dataclass(frozen=True, slots=True)
class SourceEvent:
    """One report from a source.

    ``path`` may be given as a string (absolute, normalised, as ``str(Path)`` gives it):
    the inotify source does so for file events, to build no ``Path`` per event.
    """

    kind: EventKind
    path: Path | str | None = None
    source: str = ""
    folded: int = 0
    """Further events of the same path this one stands for (the inotify source folds each read's)."""
    consumer: str | None = None
    """The consumer a ``DRIFTED`` event is for (a far-side source watches one consumer's output)."""
    drift: Drift | None = None
    """What drifted (``DRIFTED`` events): status, the WARNING line and the metric name it."""
    lost_at: float | None = None
    """A ``RESCAN`` because events were lost: when (``time.monotonic()``) the source learned of the loss
    (the engine measures how long the rescan took to start)."""


_SET_EVENT = tuple(SourceEvent.__dict__[name].__set__ for name in SourceEvent.__slots__)  # the slots' own setters


def file_event(kind: EventKind, path: str, source: str, folded: int) -> SourceEvent:
    """``SourceEvent(kind, path, source, folded)``, built through the slots' setters: a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__`` (0.81 µs, one per path of each inotify read;
    0.45 this way)."""
    ev: SourceEvent = object.__new__(SourceEvent)
    s_kind, s_path, s_source, s_folded, s_consumer, s_drift, s_lost_at = _SET_EVENT
    s_kind(ev, kind)
    s_path(ev, path)
    s_source(ev, source)
    s_folded(ev, folded)
    s_consumer(ev, None)
    s_drift(ev, None)
    s_lost_at(ev, None)
    return ev


@dataclass(frozen=True, slots=True)
class WatchRoot:
    """A configured root to watch (a file or a directory)."""

    path: Path
    recursive: bool = True


class Coverage:
    """The directories in which a source reports every change, each with the serial of the arming that covers it.

    reloadd's inotify source adds a directory when its watch is armed and discards it when
    the watch goes (or the source stops). The engine's periodic rescans trust a directory
    only if the same arming already covered it when the previous rescan of every root
    began (and it is on a local file system); they list such a directory only when its
    names changed since, and stat its files only on its turn. Sources read their events on the event loop, and so must
    update this there.
    """

    def __init__(self) -> None:
        self._dirs: dict[str, int] = {}
        self._serials = itertools.count(1)

    def add(self, directory: str) -> None:
        """``directory`` (absolute, as ``str(Path)`` spells it) is covered from now on, by a new arming."""
        self._dirs[directory] = next(self._serials)

    def discard(self, directory: str) -> None:
        """``directory`` may miss changes from now on."""
        self._dirs.pop(directory, None)

    def clear(self) -> None:
        """Nothing is covered (the source stopped)."""
        self._dirs.clear()

    def snapshot(self) -> dict[str, int]:
        """Directory -> arming serial, as it is now."""
        return dict(self._dirs)


@dataclass
class SourceContext:
    """What a source is given.

    Attributes:
        roots: Every root of every consumer.
        emit: Hand an event to the engine (never blocks).
        rescan_interval: Seconds between periodic walks (0: none).
        logger: The source's logger.
        degraded: Called by a source that lost its ability to watch (with the reason),
            so the engine can report rescan-only mode.
        coverage: Where a source that reports every change in a directory says so.
        emit_all: Hand several events to the engine in one step (a source that reads many at
            once, as inotify does: one queue entry and one wake-up, not one per event); by
            default each goes through ``emit``.
        room: Wait up to that many seconds for the engine to have room for more events; whether it
            has. A source that reads faster than paths settle keeps what it read meanwhile, as it read
            it (``None``: there is always room).
    """

    roots: tuple[WatchRoot, ...]
    emit: Callable[[SourceEvent], None]
    rescan_interval: float = 15.0
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("reloadd.source"))
    degraded: Callable[[str | None], None] = lambda reason: None
    coverage: Coverage = field(default_factory=Coverage)
    emit_all: Callable[[list[SourceEvent]], None] | None = None
    room: Callable[[float], Awaitable[bool]] | None = None

    def emit_many(self, events: list[SourceEvent]) -> None:
        """Hand ``events`` to the engine, in order (one step when the engine takes lists)."""
        if self.emit_all is not None:
            self.emit_all(events)
        else:
            for ev in events:
                self.emit(ev)


class Source(Protocol):
    """An async producer of events."""

    name: str

    async def run(self) -> None:
        """Produce events until cancelled; raise to have the supervisor rebuild the watch."""
        ...
