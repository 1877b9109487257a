"""A settled path as a consumer's work queue holds it (queued, in flight, retrying or held)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path, PosixPath

from ._types import Fingerprint, Reason

__all__ = ["Item", "path_of"]

# Python 3.11's pathlib parses every ``Path(str)`` (1.7 µs); a key is already an absolute normalised path, so its
# parts are its split. 3.12 parses lazily, and its internals differ: there the plain constructor is used.
_FROM_PARTS = (getattr(PosixPath, "_from_parsed_parts", None)
               if sys.version_info[:2] == (3, 11) and sys.platform != "win32" else None)


def path_of(key: str) -> Path:
    """``Path(key)``, built without parsing when ``key`` is absolute and normalised (what the engine's keys are)."""
    if (_FROM_PARTS is not None and key[:1] == "/" and len(key) > 1 and "//" not in key and "/./" not in key
            and key[-1] != "/" and not key.endswith("/.")):
        path: Path = _FROM_PARTS("", "/", ["/", *key[1:].split("/")])
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
