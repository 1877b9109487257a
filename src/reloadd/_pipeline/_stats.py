"""The engine's counters, read by the snapshot and the metrics exporter."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

__all__ = ["EngineStats"]


@dataclass
class EngineStats:
    """Counters a metrics exporter reads."""

    events: Counter[tuple[str, str]] = field(default_factory=Counter)
    overflows: int = 0
    rescans: int = 0
    rescan_seconds: float = 0.0
    covered_rescans: int = 0
    """Periodic rescans that took live watches on trust (a share of :attr:`rescans`)."""
    resyncs: int = 0
    handed_over: int = 0
    recovery_delays: deque[float] = field(default_factory=lambda: deque(maxlen=4096))
    """Seconds from a loss of events (an inotify overflow) to the start of its rescan, for each of the latest
    (a benchmark reads them all)."""
    restarted_rescans: int = 0
    """Walks of every root stopped part-way for a newer loss of events, whose rescan started at once."""
    reads_held: int = 0
    """Times a source held its reads back, unparsed, while more paths were due than settling takes (see
    :meth:`~reloadd._pipeline._intake.Intake.room`)."""
    rescans_waited: int = 0
    """Periodic rescans that fell due while paths were settling and waited for them (see ``rescan_wait``)."""

    @property
    def recovery_delay(self) -> float | None:
        """Seconds from the last loss of events to the start of its rescan (``None``: none yet)."""
        return self.recovery_delays[-1] if self.recovery_delays else None
