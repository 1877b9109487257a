"""``/metrics``, ``/healthz`` and ``/readyz`` on a tiny asyncio HTTP/1.1 server.

Three read-only GET endpoints do not justify a web framework: the server reads one
request head, answers, and closes the connection. Everything runs on the reloader's
own event loop, so a wedged loop shows up as a probe timeout, which is exactly what a
liveness probe is for.

Health (``/healthz``, for liveness probes and ``WatchdogSec``-style supervision):
    200 while the event loop is responsive (a ticker measures how late it wakes; more
    than :data:`MAX_LOOP_LAG` seconds late is unhealthy) and none of the reloader's
    internal tasks (the pump, a consumer queue, a source supervisor) has died. A
    restart is the right cure for both.

Readiness (``/readyz``), all of:
    * the initial pass is done: every path found at start-up was handed to its
      consumer at least once (``Reloader.ready``, or every path still waiting is
      waiting for a *retry*; one bad file must not keep a node unready forever;
      ``ready_max_age`` below catches it if it stays bad);
    * the watch is armed, or *degraded to rescans only* (an exhausted inotify watch
      limit): rescans still converge within ``rescan_interval``, so this is reported
      as ``reloadd_watch_degraded 1`` and in ``reloadd status``, not as unready;
    * no consumer has a path waiting longer than ``[reloadd] ready_max_age``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from ._errors import ConfigError, ReloaddError

if TYPE_CHECKING:
    from ._reloader import Reloader

__all__ = ["MAX_LOOP_LAG", "Health", "LoopMonitor", "Response", "parse_listen", "start_http"]

log = logging.getLogger("reloadd.http")

MAX_LOOP_LAG = 5.0
"""Seconds the event loop may wake late before ``/healthz`` fails."""

_HEAD_TIMEOUT = 10.0
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            503: "Service Unavailable"}


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

    def __init__(self, interval: float = 0.5) -> None:
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
    """Liveness and readiness of one reloader.

    Args:
        reloader: The reloader.
        monitor: The loop monitor whose ticker runs on the reloader's loop.
    """

    def __init__(self, reloader: Reloader, monitor: LoopMonitor) -> None:
        self.reloader = reloader
        self.monitor = monitor
        self._initial_done = False

    def initial_pass_done(self) -> bool:
        """Whether every path found at start-up has been handed over at least once (latched)."""
        if self._initial_done:
            return True
        r = self.reloader
        if r.ready:
            self._initial_done = True
            return True
        try:
            engine = r.engine
        except RuntimeError:
            return False
        if not engine.startup_done.is_set() or engine.busy or not engine.inbox.empty() or len(engine.agg):
            return False
        for slot in engine.slots.values():
            counts = slot.queue.counts()
            if counts.in_flight or counts.untried:
                return False
        self._initial_done = True
        return True

    def _watch_ok(self) -> bool:
        r = self.reloader
        state = r.watch_state
        if state == "armed" or state.startswith("degraded"):
            return True
        # Without inotify (or with injected sources) nothing ever reports "armed":
        # the periodic rescan is the watch.
        return state.startswith("rescan-only") or (state == "starting" and "inotify" not in r.source_names)

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """``(ready, details)`` as served by ``/readyz``."""
        r = self.reloader
        problems: list[str] = []
        if not self.initial_pass_done():
            problems.append("initial pass not done")
        if not self._watch_ok():
            problems.append(f"watch {r.watch_state}")
        ages: dict[str, float] = {}
        with contextlib.suppress(RuntimeError):
            for name, slot in r.engine.slots.items():
                ages[name] = round(slot.queue.oldest_age(), 3)
                if ages[name] > r.config.ready_max_age:
                    problems.append(
                        f"consumer {name}: a path has waited {ages[name]:.0f}s "
                        f"(ready_max_age {r.config.ready_max_age:g}s)"
                    )
        return not problems, {"ready": not problems, "problems": problems, "watch": r.watch_state,
                              "oldest_pending_age": ages}

    def dead_tasks(self) -> list[str]:
        """Names of the reloader's internal tasks that ended while it is still running."""
        return self.reloader.dead_tasks()

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        """``(alive, details)`` as served by ``/healthz``."""
        problems = []
        lag = self.monitor.lag
        if lag > MAX_LOOP_LAG:
            problems.append(f"event loop woke {lag:.1f}s late")
        dead = self.dead_tasks()
        if dead:
            problems.append(f"task(s) ended: {', '.join(dead)}")
        if self.reloader.watch_state == "stopped":
            problems.append("stopped")
        return not problems, {"alive": not problems, "problems": problems, "loop_lag": round(lag, 4)}


Handler = Callable[[str, dict[str, str]], Awaitable[Response]]


def endpoints(health: Health, registry: CollectorRegistry) -> Handler:
    """The request handler serving /metrics, /healthz and /readyz."""

    async def handle(path: str, headers: dict[str, str]) -> Response:
        if path == "/metrics":
            encoder, content_type = choose_encoder(headers.get("accept", ""))
            return Response(200, encoder(registry), content_type)
        if path in ("/healthz", "/livez"):
            ok, doc = health.liveness()
            return Response.json(200 if ok else 503, doc)
        if path == "/readyz":
            ok, doc = health.readiness()
            return Response.json(200 if ok else 503, doc)
        return Response(404, b"not found: try /metrics, /healthz or /readyz\n")

    return handle


async def start_http(listen: str, handler: Handler) -> asyncio.Server:
    """Serve ``handler`` on ``listen`` (``host:port``; port 0 picks a free one).

    Raises:
        ConfigError: ``listen`` is malformed.
        ReloaddError: the address cannot be bound (in use, not local).
    """
    host, port = parse_listen(listen)

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await _serve_one(reader, writer, handler)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("Failed to answer an HTTP request: %s", exc, exc_info=exc)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    try:
        server = await asyncio.start_server(on_connection, host, port, reuse_address=True)
    except OSError as exc:
        raise ReloaddError(f"Failed to listen on {listen} (metrics_listen): {exc.strerror or exc}") from exc
    for sock in server.sockets:
        addr = sock.getsockname()
        log.info("Serving /metrics, /healthz and /readyz on http://%s:%d",
                 f"[{addr[0]}]" if ":" in addr[0] else addr[0], addr[1])
    return server


async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _HEAD_TIMEOUT)
    except asyncio.LimitOverrunError:
        await _write(writer, "GET", Response(400, b"request head too large\n"))
        return
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        await _write(writer, "GET", Response(400, b"bad request line\n"))
        return
    method, target, _ = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        key, sep, value = line.partition(":")
        if sep:
            headers[key.strip().lower()] = value.strip()
    if method not in ("GET", "HEAD"):
        await _write(writer, method, Response(405, b"only GET and HEAD\n"))
        return
    response = await handler(urlsplit(target).path, headers)
    await _write(writer, method, response)


async def _write(writer: asyncio.StreamWriter, method: str, r: Response) -> None:
    head = (
        f"HTTP/1.1 {r.status} {_REASONS.get(r.status, 'Unknown')}\r\n"
        f"Content-Type: {r.content_type}\r\n"
        f"Content-Length: {len(r.body)}\r\n"
        f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S GMT', time.gmtime())}\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + (b"" if method == "HEAD" else r.body))
    await writer.drain()
