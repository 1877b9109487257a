"""Operations services around a reloader: HTTP (metrics, health), control socket, systemd.

One entry point, :func:`services`, starts whatever the configuration enables:

* ``[reloadd] metrics_listen = "127.0.0.1:9464"``: ``/metrics``, ``/healthz``, ``/readyz``
  (see :mod:`reloadd._ops._http` for what healthy and ready mean, :mod:`reloadd._ops._webserver`
  for the connection limits);
* ``[reloadd] control_socket = "/run/reloadd/control.sock"``: ``reloadd status`` and
  ``reloadd reload`` (see :mod:`reloadd._ops._control`);
* ``$NOTIFY_SOCKET`` in the environment (systemd ``Type=notify``): ``READY=1`` once the
  initial pass is done, ``WATCHDOG=1`` every ``WatchdogSec/2`` when ``$WATCHDOG_USEC`` is
  set, ``STATUS=`` lines, and ``STOPPING=1`` as soon as the reloader is asked to stop.

Wiring (the CLI's ``_run``; an embedder does the same, as ``reloadd.ops_services``, or
passes ``Reloader(..., serve_ops=True)``)::

    reloader = Reloader(cfg, install_signal_handlers=True)
    async with services(reloader):
        await reloader.serve()          # start(), wait for stop(), close()

Enter :func:`services` *before* the reloader starts, so ``/healthz`` answers and
``/readyz`` says "not ready" during a long start-up (a consumer connecting to
containerd, a big initial pass) instead of refusing connections, which a kubelet
liveness probe would punish with a restart. Leaving the block stops every service; the
reloader itself is not touched. Nothing is started when nothing is configured, and no
process-global state is changed (the metrics registry is private to the reloader).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._snapshot import Pipeline
from ._control import ControlServer
from ._http import Health, LoopMonitor, endpoints
from ._metrics import ReloaderCollector, build_registry, process_families, render
from ._sdnotify import Notifier, watchdog_interval

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ._webserver import HttpServer

__all__ = ["Services", "services"]

log = logging.getLogger("reloadd.services")

_STATUS_EVERY = 10.0  # seconds between STATUS= refreshes when no watchdog is set


@dataclass
class Services:
    """What :func:`services` started.

    Attributes:
        collector: The reloader's metric families, read at scrape time.
        health: Liveness and readiness, as served on /healthz and /readyz.
        http_address: ``(host, port)`` actually bound for HTTP, or ``None``.
        http: The HTTP listener (its connection counters), or ``None``.
        control_socket: The control socket path, or ``None``.
        notifier: The systemd notifier (``enabled`` false outside systemd).
    """

    collector: ReloaderCollector
    health: Health
    http_address: tuple[str, int] | None = None
    http: HttpServer | None = None
    control_socket: Path | None = None
    notifier: Notifier = field(default_factory=Notifier)
    _registry: CollectorRegistry | None = field(default=None, repr=False)

    def metrics(self, openmetrics: bool = False) -> bytes:
        """What ``/metrics`` answers: the reloader's families and ``process_*``, in the text format
        (OpenMetrics when asked)."""
        return render(itertools.chain(self.collector.collect(), process_families()), openmetrics=openmetrics)

    @property
    def registry(self) -> CollectorRegistry:
        """A private ``prometheus_client`` registry of the same families, for an embedding application's own
        exporter (built on first use: the daemon never imports ``prometheus_client``)."""
        if self._registry is None:
            self._registry = build_registry(self.collector.pipeline, loop_lag=self.collector.loop_lag)
        return self._registry

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port/metrics`` when HTTP is served."""
        if self.http_address is None:
            return None
        host, port = self.http_address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"


def status_line(pipeline: Pipeline) -> str:
    """One line for systemd's ``STATUS=``."""
    snap = pipeline.snapshot()
    if not snap.started:
        return f"watch {snap.watch}"
    t = snap.totals()
    parts = [f"{len(snap.consumers)} consumer(s)", f"watch {snap.watch}", f"{t.pending} pending"]
    if t.failing:
        parts.append(f"{t.failing} failing")
    if t.rejected:
        parts.append(f"{t.rejected} rejected")
    if t.prune_held_paths:
        parts.append(f"{t.prune_held_paths} removal(s) held")
    if t.drifted:
        parts.append(f"{t.drifted} drifted")
    return ", ".join(parts)


async def _wait_stop(reloader: Pipeline, within: float | None) -> bool:
    """Wait up to ``within`` seconds for the reloader to be asked to stop; return whether it was."""
    try:
        await asyncio.wait_for(reloader.wait_stop_requested(), within)
    except TimeoutError:
        return False
    return True


async def _systemd(reloader: Pipeline, health: Health, notifier: Notifier) -> None:
    """READY=1 after the initial pass, WATCHDOG=1 pings, STATUS= refreshes, STOPPING=1."""
    interval = watchdog_interval()
    loop = asyncio.get_running_loop()
    notifier.send(STATUS="starting: initial pass")
    # Ping the watchdog during start-up too: a large initial pass must not look like a hang.
    last_ping = -float("inf")
    while not health.initial_pass_done():
        if interval is not None and loop.time() - last_ping >= interval:
            notifier.send(WATCHDOG=1)
            last_ping = loop.time()
        with contextlib.suppress(TimeoutError, RuntimeError):
            # wait_idle wakes on every state change; RuntimeError: not started yet
            await reloader.wait_idle(min(0.5, interval or 0.5))
        if reloader.stop_requested:
            break
    if not reloader.stop_requested:
        notifier.send(READY=1, STATUS=f"ready: {status_line(reloader)}")
        log.info("Initial pass done; told the service manager READY=1")
    last_status = ""
    while not await _wait_stop(reloader, interval if interval is not None else _STATUS_EVERY):
        fields: dict[str, str | int] = {}
        if interval is not None:
            fields["WATCHDOG"] = 1
        line = status_line(reloader)
        if line != last_status:
            fields["STATUS"] = f"{'ready' if health.initial_pass_done() else 'starting'}: {line}"
            last_status = line
        notifier.send(**fields)
    notifier.send(STOPPING=1, STATUS="stopping: finishing in-flight batches")


@contextlib.asynccontextmanager
async def services(reloader: Pipeline, *, notify_socket: str | None = None) -> AsyncIterator[Services]:
    """Run the configured services around ``reloader`` for the duration of the block.

    Args:
        reloader: The reloader (started or not).
        notify_socket: The systemd notification socket; default ``$NOTIFY_SOCKET``.

    Raises:
        ConfigError: ``metrics_listen`` is malformed, or ``control_socket`` names a non-socket.
        ReloaddError: the HTTP address or the control socket cannot be bound (in use,
            another daemon serving it).
    """
    cfg = reloader.config
    monitor = LoopMonitor()
    health = Health(reloader, monitor)
    collector = ReloaderCollector(reloader, loop_lag=monitor.value)
    svc = Services(collector=collector, health=health, notifier=Notifier(notify_socket))
    tasks: list[asyncio.Task[Any]] = [asyncio.create_task(monitor.run(), name="reloadd-loop-monitor")]
    http: HttpServer | None = None
    control: ControlServer | None = None
    try:
        if cfg.metrics_listen:
            from ._webserver import start_http

            http = await start_http(cfg.metrics_listen, endpoints(health, svc.metrics))
            svc.http_address = http.address
            svc.http = http
        if cfg.control_socket:
            def extra() -> dict[str, Any]:
                return {"metrics": svc.metrics_url}

            control = ControlServer(reloader, cfg.control_socket, extra=extra)
            await control.start()
            svc.control_socket = cfg.control_socket
        if svc.notifier.enabled:
            sd = _systemd(reloader, health, svc.notifier)
            tasks.append(asyncio.create_task(sd, name="reloadd-sdnotify"))
        reloader.ops = svc
        yield svc
    finally:
        reloader.ops = None
        for t in tasks:
            if not t.done() and t.get_name() == "reloadd-sdnotify" and reloader.stop_requested:
                # let it send STOPPING=1 before it is cancelled
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(t), 1.0)
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if control is not None:
            await control.close()
        if http is not None:
            await http.close()
        svc.notifier.close()
