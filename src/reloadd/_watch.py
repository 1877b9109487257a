"""The watch's state, decided in one place and read by status, /readyz, /healthz, metrics and systemd."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Watch", "WatchState"]


class WatchState(enum.StrEnum):
    """How changes are being noticed."""

    STARTING = "starting"
    """Sources are being started; nothing is known yet."""
    ARMED = "armed"
    """Every inotify watch is in place (rescans are the safety net)."""
    DEGRADED = "degraded"
    """inotify could not cover everything (a kernel limit): periodic rescans carry the watch."""
    RESCAN_ONLY = "rescan-only"
    """No inotify by design (``inotify = false`` or injected sources): rescans are the watch."""
    STOPPED = "stopped"
    """The reloader was closed."""


@dataclass(frozen=True, slots=True)
class Watch:
    """The watch state and why (for DEGRADED and RESCAN_ONLY)."""

    state: WatchState = WatchState.STARTING
    reason: str | None = None

    @property
    def serving(self) -> bool:
        """Changes are being noticed (in time or by rescans): the readiness verdict on the watch."""
        return self.state in (WatchState.ARMED, WatchState.DEGRADED, WatchState.RESCAN_ONLY)

    def __str__(self) -> str:
        if self.state is WatchState.DEGRADED:
            return f"degraded (rescan-only): {self.reason}"
        if self.state is WatchState.RESCAN_ONLY:
            return f"rescan-only ({self.reason})"
        return self.state.value
