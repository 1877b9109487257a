"""The HTTP listener for ``/metrics``, ``/healthz`` and ``/readyz``: aiohttp, with hard limits.

``metrics_listen`` is reachable by every local user (and by the network when it names
one), so nothing a client does may cost the daemon more than a bounded share of its
file descriptors or time. Without limits, 1,100 half-open connections used up the
daemon's fds: the exec consumer then failed with "Too many open files" and
``/healthz`` refused, so one unprivileged user could stall every consumer.

Limits (module constants, seconds and counts):

* :data:`MAX_CONNECTIONS` connections at once. When all are taken, the oldest one
  that has not sent a complete request yet is dropped to make room, so a fresh probe
  gets in at once even while idle connections fill every slot; if every slot is busy
  answering a request, the new connection gets a bare ``503`` and is closed in the
  loop iteration that accepted it. Either way excess connections hold no descriptor.
* :data:`HEAD_TIMEOUT`: a connection that has not sent a complete request head by
  then (idle, half-open, or trickling headers byte by byte) is aborted.
* :data:`CONNECTION_TIMEOUT`: no connection lives longer than this, whatever it does
  (e.g. never reading the response to ``/metrics``).
* Request heads: lines and header fields at most :data:`MAX_LINE` bytes,
  :data:`MAX_HEADERS` fields. Request bodies are refused (``413``), never read.
* One request per connection (``Connection: close``), as probes and scrapers expect.
* ``HTTP/1.0`` and ``HTTP/1.1`` only (``505``), and only origin-form targets such as
  ``/metrics`` (``400`` for ``http://host/metrics``, ``host:port`` and ``*``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import HttpVersion10, HttpVersion11, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from ._errors import ReloaddError
from ._http import Handler, parse_listen

__all__ = [
    "CONNECTION_TIMEOUT",
    "HEAD_TIMEOUT",
    "MAX_CONNECTIONS",
    "MAX_HEADERS",
    "MAX_LINE",
    "HttpServer",
    "start_http",
]

log = logging.getLogger("reloadd.http")

MAX_CONNECTIONS = 64
"""Concurrent HTTP connections; more are refused at once (a scrape and a few probes need 3)."""
HEAD_TIMEOUT = 3.0
"""Seconds a connection may take to send its request head."""
CONNECTION_TIMEOUT = 10.0
"""Seconds any connection may stay open."""
MAX_LINE = 4096
"""Bytes in the request line or in one header field."""
MAX_HEADERS = 32
"""Header fields in a request."""
_BACKLOG = 64  # also how many connections asyncio accepts per loop iteration
_REFUSAL = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_WARN_EVERY = 60.0
_HEADERS = {"Cache-Control": "no-store", "Server": "reloadd"}


class _MalformedRequests(logging.Filter):
    """Drop aiohttp's tracebacks for malformed requests (answered 400 by aiohttp).

    They are the client's fault, and any local user could fill the journal with them.
    Errors in reloadd's own handlers (500) still get logged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], HttpProcessingError))


_request_log = logging.getLogger("reloadd.http.requests")
_request_log.addFilter(_MalformedRequests())


class _Refuse(asyncio.Protocol):
    """The protocol of a connection over the cap: a bare 503, then the descriptor is gone."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        with contextlib.suppress(OSError, RuntimeError):
            transport.write(_REFUSAL)
        if transport.get_write_buffer_size():
            transport.abort()  # the peer is not reading: do not wait for it
        else:
            transport.close()


@dataclass
class _Conn:
    created: float
    served: bool = False
    transport: asyncio.Transport | None = None
    timer: asyncio.TimerHandle | None = None


@dataclass
class _Stats:
    refused: int = 0
    evicted: int = 0
    timed_out: int = 0
    last_warning: float = field(default=-_WARN_EVERY)


class _BoundedServer(web.Server):
    """aiohttp's low-level server with a connection cap and per-connection deadlines."""

    def __init__(self, handler: Any, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.live: dict[RequestHandler, _Conn] = {}
        self.stats = _Stats()

    def __call__(self) -> Any:  # RequestHandler, or _Refuse over the cap
        self._forget_stale()
        if len(self.live) >= MAX_CONNECTIONS:
            self._evict_idle()
        if len(self.live) >= MAX_CONNECTIONS:
            self.stats.refused += 1
            self._warn()
            return _Refuse()
        handler = super().__call__()
        self.live[handler] = _Conn(created=time.monotonic())
        return handler

    def _warn(self) -> None:
        now = time.monotonic()
        if now - self.stats.last_warning >= _WARN_EVERY:
            self.stats.last_warning = now
            log.warning("Too many HTTP connections on metrics_listen: %d open (the limit); %d idle ones dropped "
                        "and %d refused so far", len(self.live), self.stats.evicted, self.stats.refused)

    def _forget_stale(self) -> None:
        # A protocol whose transport never got made (accept failed half-way) never sees
        # connection_lost; without this it would hold a slot for good.
        limit = time.monotonic() - CONNECTION_TIMEOUT - HEAD_TIMEOUT
        for handler, conn in list(self.live.items()):
            if conn.timer is None and conn.created < limit:
                del self.live[handler]

    def _evict_idle(self) -> None:
        # The oldest connection that has not sent a request yet makes room for the new
        # one: a fresh probe gets in at once even while idle connections fill every
        # slot, and a request being answered is never cut off.
        idle = [(c.created, h) for h, c in self.live.items() if not c.served and c.transport is not None]
        if not idle:
            return
        _, handler = min(idle, key=lambda item: item[0])
        conn = self.live.pop(handler)
        if conn.timer is not None:
            conn.timer.cancel()
        assert conn.transport is not None
        conn.transport.abort()
        self.stats.evicted += 1
        self._warn()

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        conn = self.live.setdefault(handler, _Conn(created=time.monotonic()))
        conn.transport = transport
        conn.timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT, self._deadline, handler, transport)

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        conn = self.live.pop(handler, None)
        if conn is not None and conn.timer is not None:
            conn.timer.cancel()

    def mark_served(self, handler: RequestHandler) -> None:
        """A complete request head arrived on ``handler``'s connection."""
        conn = self.live.get(handler)
        if conn is not None:
            conn.served = True

    def _deadline(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        conn = self.live.get(handler)
        if conn is None or transport.is_closing():
            return
        if conn.served and time.monotonic() - conn.created < CONNECTION_TIMEOUT:
            conn.timer = asyncio.get_running_loop().call_later(
                CONNECTION_TIMEOUT - HEAD_TIMEOUT, self._deadline, handler, transport)
            return
        self.stats.timed_out += 1
        transport.abort()  # connection_lost follows and frees the slot


class HttpServer:
    """A running HTTP listener, as returned by :func:`start_http`."""

    def __init__(self, server: asyncio.Server, web_server: _BoundedServer) -> None:
        self._server = server
        self._web = web_server

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` actually bound."""
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    @property
    def open_connections(self) -> int:
        """Connections currently open (at most :data:`MAX_CONNECTIONS`)."""
        return len(self._web.live)

    @property
    def refused(self) -> int:
        """Connections refused because :data:`MAX_CONNECTIONS` were open."""
        return self._web.stats.refused

    @property
    def evicted(self) -> int:
        """Idle connections dropped to make room for a new one at :data:`MAX_CONNECTIONS`."""
        return self._web.stats.evicted

    @property
    def timed_out(self) -> int:
        """Connections aborted by :data:`HEAD_TIMEOUT` or :data:`CONNECTION_TIMEOUT`."""
        return self._web.stats.timed_out

    async def close(self) -> None:
        """Stop listening and close every connection (in-flight requests get 1 s)."""
        self._server.close()
        await self._web.shutdown(1.0)
        for conn in list(self._web.live.values()):
            if conn.transport is not None:
                conn.transport.abort()
        await self._server.wait_closed()


def _plain(status: int, text: str, **headers: str) -> web.Response:
    resp = web.Response(status=status, text=text, headers={**_HEADERS, **headers})
    resp.force_close()
    return resp


def _adapt(handler: Handler, server: list[_BoundedServer]) -> Any:
    """The aiohttp request handler: checks the request, then asks ``handler``."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        server[0].mark_served(request.protocol)
        if request.version not in (HttpVersion10, HttpVersion11):
            return _plain(505, "only HTTP/1.0 and HTTP/1.1\n")
        if not request.raw_path.startswith("/"):
            return _plain(400, "the request target must be a path such as /metrics\n")
        if request.method not in ("GET", "HEAD"):
            return _plain(405, "only GET and HEAD\n", Allow="GET, HEAD")
        if request.body_exists:
            return _plain(413, "request bodies are not accepted\n")
        headers = {k.lower(): v for k, v in request.headers.items()}
        r = await handler(request.path, headers)
        resp = web.Response(status=r.status, body=r.body, headers={**_HEADERS, "Content-Type": r.content_type})
        resp.force_close()
        return resp

    return handle


async def start_http(listen: str, handler: Handler) -> HttpServer:
    """Serve ``handler`` on ``listen`` (``host:port``; port 0 picks a free one), within the limits above.

    Raises:
        ConfigError: ``listen`` is malformed.
        ReloaddError: the address cannot be bound (in use, not local).
    """
    host, port = parse_listen(listen)
    holder: list[_BoundedServer] = []
    web_server = _BoundedServer(
        _adapt(handler, holder),
        handler_cancellation=True,
        keepalive_timeout=HEAD_TIMEOUT,
        lingering_time=0,
        max_line_size=MAX_LINE,
        max_field_size=MAX_LINE,
        max_headers=MAX_HEADERS,
        access_log=None,
        logger=_request_log,
    )
    holder.append(web_server)
    loop = asyncio.get_running_loop()
    try:
        server = await loop.create_server(web_server, host, port, reuse_address=True, backlog=_BACKLOG)
    except OSError as exc:
        raise ReloaddError(f"Failed to listen on {listen} (metrics_listen): {exc.strerror or exc}") from exc
    for addr in _addresses(server):
        log.info("Serving /metrics, /healthz and /readyz on http://%s:%d", *addr)
    return HttpServer(server, web_server)


def _addresses(server: asyncio.Server) -> Iterator[tuple[str, int]]:
    for sock in server.sockets:
        addr = sock.getsockname()
        yield (f"[{addr[0]}]" if ":" in addr[0] else addr[0]), addr[1]
