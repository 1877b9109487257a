"""What ``/metrics``, ``/healthz`` and ``/readyz`` answer (served by :mod:`reloadd._ops._webserver`).

Everything runs on the reloader's own event loop, so a wedged loop shows up as a probe
timeout, which is exactly what a liveness probe is for.

Health (``/healthz``, for liveness probes and ``WatchdogSec``-style supervision):
    200 while the event loop is responsive (a ticker measures how late it wakes; more
    than :data:`MAX_LOOP_LAG` seconds late is unhealthy) and none of the reloader's
    internal tasks (the pump, a consumer queue, a source supervisor) has died. A
    restart is the right cure for both.

Readiness (``/readyz``) is :meth:`reloadd._snapshot.Snapshot.readiness`, the one rule
``reloadd status``, the metrics and systemd use too: the initial pass is done, the watch
serves (armed, or degraded to rescans only, which still converge), no path has
waited longer than ``[reloadd] ready_max_age``, and no consumer's state has gone unpersisted
(its writes failing) for longer than that either.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigError
from .._snapshot import Pipeline
from .._watch import WatchState
from ._metrics import negotiate

__all__ = ["LOOP_TICK", "MAX_LOOP_LAG", "Handler", "Health", "LoopMonitor", "Response", "endpoints", "parse_listen"]

MAX_LOOP_LAG = 5.0
"""Seconds the event loop may wake late before ``/healthz`` fails."""

LOOP_TICK = MAX_LOOP_LAG / 2
"""Seconds between the loop monitor's wake-ups: a stall longer than ``MAX_LOOP_LAG + LOOP_TICK`` is always
seen. Every wake-up of an idle daemon costs ~0.15 ms of CPU (the scheduler and the loop's turn): at 0.5 s
the monitor alone took 0.03 % of a core, most of the daemon's idle cost."""


def parse_listen(listen: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` for IPv6).

    Raises:
        ConfigError: malformed, or no host given (an empty host would silently mean
            "every interface"; the config must say so explicitly, e.g. ``0.0.0.0:9464``).
    """
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"[reloadd] metrics_listen: expected host:port, got {listen!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host:
        raise ConfigError(
            f"[reloadd] metrics_listen: {listen!r} has no host; write 127.0.0.1:{port} for this "
            f"node only or 0.0.0.0:{port} for every interface"
        )
    return host, int(port)


class LoopMonitor:
    """Measure how late the event loop wakes a sleeper (its lag).

    Args:
        interval: Seconds between ticks.
    """

    def __init__(self, interval: float = LOOP_TICK) -> None:
        self.interval = interval
        self.lag = 0.0
        self.max_lag = 0.0
        self.last_tick: float | None = None

    async def run(self) -> None:
        """Tick until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.interval)
            now = loop.time()
            self.lag = max(0.0, now - start - self.interval)
            self.max_lag = max(self.max_lag, self.lag)
            self.last_tick = now

    def value(self) -> float | None:
        """The last measured lag (``None`` before the first tick)."""
        return self.lag if self.last_tick is not None else None


@dataclass(frozen=True)
class Response:
    """An HTTP response."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"

    @classmethod
    def json(cls, status: int, doc: Any) -> Response:
        """A JSON response."""
        return cls(status, json.dumps(doc, indent=1).encode() + b"\n", "application/json")


class Health:
    """Liveness and readiness of one pipeline, read from its snapshot.

    Args:
        pipeline: The pipeline (a :class:`~reloadd.Reloader`).
        monitor: The loop monitor whose ticker runs on the pipeline's loop.
    """

    def __init__(self, pipeline: Pipeline, monitor: LoopMonitor) -> None:
        self.pipeline = pipeline
        self.monitor = monitor

    def initial_pass_done(self) -> bool:
        """Whether every path found at start-up has been handed over at least once (latched)."""
        return self.pipeline.snapshot().initial_pass_done

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """``(ready, details)`` as served by ``/readyz`` (the snapshot's one rule)."""
        snap = self.pipeline.snapshot()
        ready, problems = snap.readiness()
        ages = {c.name: round(c.oldest_pending_age, 3) for c in snap.consumers}
        return ready, {"ready": ready, "problems": problems, "watch": str(snap.watch), "oldest_pending_age": ages}

    def dead_tasks(self) -> list[str]:
        """Names of the pipeline's internal tasks that ended while it is still running."""
        return list(self.pipeline.snapshot().dead_tasks)

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        """``(alive, details)`` as served by ``/healthz``."""
        problems = []
        lag = self.monitor.lag
        if lag > MAX_LOOP_LAG:
            problems.append(f"event loop woke {lag:.1f}s late")
        snap = self.pipeline.snapshot()
        if snap.dead_tasks:
            problems.append(f"task(s) ended: {', '.join(snap.dead_tasks)}")
        if snap.watch.state is WatchState.STOPPED:
            problems.append("stopped")
        return not problems, {"alive": not problems, "problems": problems, "loop_lag": round(lag, 4)}


Handler = Callable[[str, dict[str, str]], Awaitable[Response]]
"""Answers a GET for a path, given the request headers (lower-case names)."""


def endpoints(health: Health, metrics: Callable[[bool], bytes]) -> Handler:
    """The request handler serving /metrics (``metrics(openmetrics)``, as ``Accept`` asks), /healthz and /readyz."""

    async def handle(path: str, headers: dict[str, str]) -> Response:
        if path == "/metrics":
            openmetrics, content_type = negotiate(headers.get("accept", ""))
            return Response(200, metrics(openmetrics), content_type)
        if path in ("/healthz", "/livez"):
            ok, doc = health.liveness()
            return Response.json(200 if ok else 503, doc)
        if path == "/readyz":
            ok, doc = health.readiness()
            return Response.json(200 if ok else 503, doc)
        return Response(404, b"not found: try /metrics, /healthz or /readyz\n")

    return handle
