"""Guarded state: what one consumer's far-side sources saw drift, and when to correct it.

A far-side source (containerd's image events, a Kubernetes watch, the hosts.toml guard) emits a
``DRIFTED`` event naming the file that declared the thing that moved. The engine asks this book what
to do with it, by the consumer's ``drift`` mode:

* ``correct``: hand the file over again, forced, now, unless the same file was corrected lately and
  drifted again: something keeps undoing reloadd (another controller owning the same field, a GC
  that keeps deleting): a drift within :data:`FIGHT_WINDOW` seconds of the last correction. Corrections
  of that file then back off (1 s, 2 s, 4 s ... up to 5 min), so a fight costs a dozen applies an hour,
  not one per event; the streak ends once the file stays put for the window (or twice its last delay).
* ``detect``: change nothing; the drift is listed until the file is next handed over successfully.
* ``off``: no far-side source runs; a stray event is ignored.

Every episode is one WARNING line, every correction of a fight one more; the events in between are
DEBUG. What is drifted now, and what it is fighting, is in status and metrics (:meth:`DriftBook.entries`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from .._backoff import Backoff
from .._source import Drift
from .._types import DriftMode

__all__ = ["FIGHT_WINDOW", "QUIET", "DriftBook", "Drifted"]

log = logging.getLogger("reloadd.drift")

FIGHT_WINDOW = 5.0
"""A drift within this many seconds of the last correction (or of twice its delay, if longer) continues a fight:
whatever undoes reloadd reacts to its writes, so separate edits by people start new episodes."""

QUIET = 30.0
"""Seconds a restored entry stays listed in status (the last fight's story), unless its backoff was longer."""


@dataclass
class Drifted:
    """One file whose declared state drifted, as status shows it.

    Attributes:
        path: The file that declared it.
        drift: What moved, last seen.
        since: Wall-clock time the episode began.
        events: Drift events seen in this episode.
        corrections: Times the file was handed over again for it in this episode (a fight when > 1).
        next_at: Monotonic time of the next correction when one waits out the backoff, else ``None``.
        last_at: Monotonic time of the last drift event.
        corrected_at: Monotonic time of the last correction, else ``None``.
    """

    path: str
    drift: Drift
    since: float
    events: int = 1
    corrections: int = 0
    next_at: float | None = None
    last_at: float = 0.0
    corrected_at: float | None = None
    restored: bool = False
    restored_at: float = 0.0

    @property
    def fighting(self) -> bool:
        """Something keeps undoing the corrections."""
        return self.corrections > 1


class DriftBook:
    """One consumer's drift: the episodes open now and the backoff of their corrections.

    Args:
        consumer: The consumer's name (for the log).
        mode: Its ``drift`` mode.
        backoff: Delays between corrections of one file that keeps drifting.
        clock: Monotonic clock, injectable for tests.
    """

    def __init__(self, consumer: str, mode: DriftMode = DriftMode.CORRECT, *,
                 backoff: Backoff | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.consumer = consumer
        self.mode = mode
        self._backoff = backoff or Backoff(1.0, 300.0, jitter=False)
        self._clock = clock
        self._open: dict[str, Drifted] = {}
        self.total: Counter[str] = Counter()
        """Drift events seen, per kind (the metric ``reloadd_drift_total``)."""

    def saw(self, path: str, drift: Drift | None) -> float | None:
        """A source saw ``path``'s state drift: seconds until it is to be corrected, or ``None`` for not now.

        ``None`` in ``detect`` and ``off`` modes, and while a correction of the path already waits.
        """
        if self.mode is DriftMode.OFF:
            return None
        drift = drift or Drift("state", path, "changed")
        now = self._clock()
        self.total[drift.kind] += 1
        entry = self._open.get(path)
        calm = entry is not None and self._quiet(entry, now, FIGHT_WINDOW)
        if entry is None or calm:
            entry = self._open[path] = Drifted(path, drift, time.time(), last_at=now)
            what = "correcting it" if self.mode is DriftMode.CORRECT else "detect only: left as it is"
            log.warning("Drift in consumer %s: %s (declared by %s); %s", self.consumer, drift, path, what)
        else:
            entry.events += 1
            entry.drift = drift
            entry.last_at = now
            entry.restored = False
        if self.mode is not DriftMode.CORRECT or entry.next_at is not None:
            log.debug("Drift in consumer %s again: %s (declared by %s)", self.consumer, drift, path)
            return None
        delay = self._delay(entry.corrections)
        entry.next_at = now + delay
        if entry.corrections:
            log.warning("Drift in consumer %s again, correction %d in %.0fs: %s (declared by %s)%s",
                        self.consumer, entry.corrections + 1, delay, drift, path,
                        f"; fighting {drift.by}" if drift.by else "; something keeps undoing it")
        return delay

    def _quiet(self, entry: Drifted, now: float, window: float) -> bool:
        """Restored, and left alone since for ``window`` seconds or twice its last backoff delay if longer."""
        return entry.restored and now - entry.restored_at > max(window, 2 * self._delay(entry.corrections))

    def _delay(self, corrections: int) -> float:
        return 0.0 if corrections == 0 else self._backoff.delay(corrections)

    def correcting(self, path: str) -> None:
        """The correction of ``path`` is being handed over now."""
        entry = self._open.get(path)
        if entry is not None:
            entry.next_at = None
            entry.corrections += 1
            entry.corrected_at = self._clock()

    def settled(self, path: str) -> None:
        """``path`` was handed over and acknowledged: what drifted is as the file declares again.

        In ``correct`` mode the entry is kept, marked restored, until it stays quiet (a fight goes on
        from there); in ``detect`` mode a successful hand-over (an edit, a SIGHUP) closes it.
        """
        entry = self._open.get(path)
        if entry is None:
            return
        if self.mode is DriftMode.CORRECT and entry.corrected_at is not None:
            if not entry.restored:
                log.info("Drift in consumer %s corrected: %s (declared by %s)", self.consumer, entry.drift, path)
                entry.restored = True
                entry.restored_at = self._clock()
        else:
            self._open.pop(path, None)

    def forget(self, path: str) -> None:
        """``path`` is gone (deleted and removed): nothing it declared is guarded any more."""
        self._open.pop(path, None)

    def entries(self) -> list[Drifted]:
        """Open episodes, oldest first: unrestored ones, and restored ones still within their quiet time."""
        now = self._clock()
        for path, entry in list(self._open.items()):
            if entry.next_at is None and self._quiet(entry, now, QUIET):
                del self._open[path]
        return sorted(self._open.values(), key=lambda e: e.since)

    def drifted(self) -> list[Drifted]:
        """Entries whose state is not as declared right now (drifted and not yet restored)."""
        return [e for e in self.entries() if not e.restored]
