"""A settled path as a consumer's work queue holds it (queued, in flight, retrying or held)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ._types import Fingerprint, Reason

__all__ = ["Item"]


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
        return Path(self.key)
