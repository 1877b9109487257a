"""A settled path as a consumer's work queue holds it (queued, in flight, retrying or held)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path, PosixPath

from .._types import Fingerprint, Reason

__all__ = ["Item", "forget_parts", "path_of"]

# Python 3.11's pathlib parses every ``Path(str)`` (1.7 µs); a key is already an absolute normalised path, so its
# parts are its split, set as ``PosixPath._from_parsed_parts`` sets them. 3.12 parses lazily, and its internals
# differ: there the plain constructor is used.
_PARTS_SET = (sys.version_info[:2] == (3, 11) and sys.platform != "win32"
              and hasattr(PosixPath, "_from_parsed_parts"))
_new = object.__new__
_DIR_PARTS: dict[str, tuple[str, ...]] = {}
"""Directory -> its parts, for :func:`path_of` (the paths of a batch share their directories' part strings)."""
_DIR_PARTS_MAX = 1024


def forget_parts() -> None:
    """Empty :func:`path_of`'s memo of directories' parts (a burst is over)."""
    _DIR_PARTS.clear()


def path_of(key: str) -> Path:
    """``Path(key)``, built without parsing when ``key`` is absolute and normalised (what the engine's keys are).

    Its parts share their directory's strings with every path of that directory, and its string is ``key``
    itself: 268 bytes a path against 621 for a split of each path and its string joined again when a consumer
    asks for it; 0.69 µs to build against 0.80, and ``str(path)`` 0.04 against 0.75 the first time.
    """
    if (_PARTS_SET and key[:1] == "/" and len(key) > 1 and "//" not in key and "/./" not in key
            and key[-1] != "/" and not key.endswith("/.")):
        head, _, name = key.rpartition("/")
        parts = _DIR_PARTS.get(head)
        if parts is None:
            if len(_DIR_PARTS) >= _DIR_PARTS_MAX:
                _DIR_PARTS.clear()
            parts = _DIR_PARTS[head] = ("/", *head[1:].split("/")) if head else ("/",)
        path: Path = _new(PosixPath)  # PosixPath._from_parsed_parts("", "/", [*parts, name]) without its call
        path._drv, path._root, path._parts = "", "/", [*parts, name]  # type: ignore[attr-defined]
        path._str = key  # type: ignore[attr-defined]  # what str(path) would join again from the parts
        return path
    return Path(key)


@dataclass(slots=True)
class Item:
    """A settled path waiting for (or retrying) delivery.

    ``key`` is the path as a string, the queue's and the records' key. The ``Path``
    handed to the consumer is built when its batch is formed: 100,000 queued paths
    hold 100,000 strings, not 100,000 ``Path`` objects.
    """

    key: str
    root: Path | None
    fingerprint: Fingerprint | None
    digest: str | None
    forced: bool
    reason: Reason
    since: float = 0.0
    attempts: int = 0
    not_before: float = 0.0
    last_error: str | None = None
    deferred: str | None = None
    group: str | None = None
    checked: bool = False  # found needed when queued, with no batch of its path running: not asked again
    hold: str | None = None  # the engine judged this removal's input lost: held, not queued (why)
    confirmed: bool = False  # a person confirmed this held removal

    @property
    def path(self) -> Path:
        """The path as a ``Path`` (built on each call)."""
        return path_of(self.key)
