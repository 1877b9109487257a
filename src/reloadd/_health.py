"""What a consumer says of the health of what it delivered, after the delivery was acknowledged.

An acknowledged path is *applied*, not necessarily *done*: a Kubernetes Deployment whose pods never become
ready was accepted by the API server all the same. A consumer that can tell (``kube-manifests`` watches its
objects) implements :class:`~reloadd.HealthReporting`; the core shows its :class:`HealthReport` in ``reloadd
status`` (a line per path not current), ``--json`` (``health``), ``/metrics`` (``reloadd_objects``,
``reloadd_health_current_seconds``) and makes the consumers ordered ``after`` it wait while it is
:attr:`HealthReport.settling`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["FileHealth", "HealthReport", "Histogram"]


@dataclass(frozen=True, slots=True)
class FileHealth:
    """The health of one path that is not current.

    Attributes:
        path: The path.
        state: ``applying``, ``progressing`` or ``failed`` (``current`` paths are not listed).
        since: Unix time the path entered ``state``.
        object: The object that decides it (the failed one, or the first still progressing), or ``""``.
        reason: Its condition reason (``ProgressDeadlineExceeded``, ``HealthTimeout``...), or ``""``.
        message: The condition's message, or ``""``.
        wave: The wave the path waits in (``None``: no waves).
    """

    path: str
    state: str
    since: float
    object: str = ""
    reason: str = ""
    message: str = ""
    wave: int | None = None

    def line(self) -> str:
        """``FAILED manifests/web.yaml: Deployment web/app: ProgressDeadlineExceeded: …`` (status prints it)."""
        parts = [p for p in (self.object, self.reason, self.message) if p]
        return f"{self.state.upper()} {self.path}" + (f": {': '.join(parts)}" if parts else "")


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative Prometheus histogram: ``counts[i]`` observations ≤ ``bounds[i]`` (seconds)."""

    bounds: tuple[float, ...] = ()
    counts: tuple[int, ...] = ()
    total: float = 0.0
    count: int = 0


@dataclass(frozen=True, slots=True)
class HealthReport:
    """One consumer's health, as status and metrics show it.

    Attributes:
        objects: Things delivered, by health (``current``, ``progressing``, ``failed``, ``terminating``).
        files: The paths that are not current.
        settling: Whether some path is still applying or progressing (within its health timeout): the
            consumers ordered ``after`` this one wait while it is.
        to_current: Seconds from a path's save to its being current.
    """

    objects: Mapping[str, int] = field(default_factory=dict)
    files: tuple[FileHealth, ...] = ()
    settling: bool = False
    to_current: Histogram = field(default_factory=Histogram)
