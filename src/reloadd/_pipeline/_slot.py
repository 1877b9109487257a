"""A consumer as the engine holds it: its filter (memoised), its records, its queue, its drift book."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from .._consumer import BaseConsumer, Consumer
from .._filters import PathFilter
from .._state._records import RecordStore
from ._drift import DriftBook
from ._item import path_of
from ._queue import WorkQueue

__all__ = ["OWNS_CACHE", "Slot"]

log = logging.getLogger("reloadd.engine")

OWNS_CACHE = 1 << 15  # memoised filter verdicts; recorded paths never need one


@dataclass
class Slot:
    """A consumer as the engine holds it."""

    consumer: Consumer
    filter: PathFilter
    records: RecordStore
    queue: WorkQueue
    drift: DriftBook = field(default=None)  # type: ignore[assignment]  # set in __post_init__ when not given

    @property
    def name(self) -> str:
        """The consumer's name."""
        return self.consumer.name

    def __post_init__(self) -> None:
        if self.drift is None:
            self.drift = DriftBook(self.consumer.name)
        self._owns: dict[str, bool] = {}
        self._bad_accepts: set[str] = set()
        # Not overridden: no Path to build per event.
        self._accepts_all = type(self.consumer).accepts is BaseConsumer.accepts

    def owns(self, key: str, path: Path | None = None) -> bool:
        """Whether the path ``key`` is this consumer's business (the path filter is memoised).

        ``path`` is the same path as a ``Path`` when the caller has one (else one is built).
        """
        hit = self._owns.get(key)
        if hit is None:
            if len(self._owns) >= OWNS_CACHE:
                self._owns.clear()
            hit = self._owns[key] = self.filter.matches(key)
        if not hit:
            return False
        if self._accepts_all:
            return True
        try:
            return bool(self.consumer.accepts(path if path is not None else path_of(key)))  # no name interned
        except Exception as exc:  # a plugin bug must not stop the pump for everyone
            if key not in self._bad_accepts:
                self._bad_accepts.add(key)
                log.error("Failed to filter %s in consumer %s: %s", key, self.name, exc)
            return False
