"""The HTTP listener for ``/metrics``, ``/healthz`` and ``/readyz``: asyncio streams, with hard limits.

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
import http
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import unquote

from .._errors import ReloaddError
from ._http import Handler, Response, parse_listen

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
_VERSION = re.compile(rb"HTTP/(\d)\.(\d)")
_KNOWN_VERSIONS = {(0, 9), (1, 0), (1, 1), (2, 0), (3, 0)}
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


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


class _BadRequest(Exception):
    def __init__(self, status: int, text: str, **headers: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text
        self.headers = headers


@dataclass
class _Head:
    method: str
    target: str
    headers: dict[str, str]


def _parse_head(raw: bytes) -> _Head:
    """The request line and header fields of ``raw`` (the head without its blank line), checked."""
    lines = raw.split(b"\n")
    lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise _BadRequest(400, "malformed request line\n")
    method, target, version = parts
    match = _VERSION.fullmatch(version)
    if match is None or (int(match[1]), int(match[2])) not in _KNOWN_VERSIONS:
        raise _BadRequest(400, "malformed HTTP version\n")
    if (int(match[1]), int(match[2])) not in ((1, 0), (1, 1)):
        raise _BadRequest(505, "only HTTP/1.0 and HTTP/1.1\n")
    if len(lines) - 1 > MAX_HEADERS:
        raise _BadRequest(400, f"more than {MAX_HEADERS} header fields\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or _TOKEN.fullmatch(name) is None:
            raise _BadRequest(400, "malformed header field\n")
        key = name.decode("ascii").lower()
        text = value.strip(b" \t").decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    if not target.startswith(b"/"):
        raise _BadRequest(400, "the request target must be a path such as /metrics\n")
    if method not in (b"GET", b"HEAD"):
        raise _BadRequest(405, "only GET and HEAD\n", Allow="GET, HEAD")
    if "transfer-encoding" in headers or headers.get("content-length", "0").strip() not in ("0", ""):
        raise _BadRequest(413, "request bodies are not accepted\n")
    return _Head(method.decode("ascii"), target.decode("latin-1"), headers)


def _encode(status: int, body: bytes, content_type: str, head_only: bool, **extra: str) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    fields = {"Content-Type": content_type, "Content-Length": str(len(body)), "Cache-Control": "no-store",
              "Server": "reloadd", "Connection": "close", **extra}
    head = f"HTTP/1.1 {status} {phrase}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n"
    return head.encode("latin-1") + (b"" if head_only else body)


class _Connection(asyncio.Protocol):
    """One client connection: reads a request head within the limits, answers it, closes."""

    def __init__(self, server: _Server) -> None:
        self.server = server
        self.created = time.monotonic()
        self.served = False
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None
        self._buf = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT, self._deadline)

    def data_received(self, data: bytes) -> None:
        if self.served:
            return  # a body or a pipelined request: never read (answered 413, or one request per connection)
        self._buf += data
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            end = self._buf.find(b"\n\n")
        head = bytes(self._buf if end < 0 else self._buf[:end])
        if any(len(line) > MAX_LINE + 1 for line in head.split(b"\n")):
            self._answer_bad(_BadRequest(400, f"a request line or header field over {MAX_LINE} bytes\n"))
            return
        if head.count(b"\n") > MAX_HEADERS + 1:  # early, on a head still coming; _parse_head counts exactly
            self._answer_bad(_BadRequest(400, f"more than {MAX_HEADERS} header fields\n"))
            return
        if end < 0:
            return
        self.served = True
        self._buf = bytearray()
        try:
            parsed = _parse_head(head)
        except _BadRequest as exc:
            self._answer_bad(exc)
            return
        self.task = asyncio.get_running_loop().create_task(self._respond(parsed))

    def eof_received(self) -> bool:
        # A client that shuts down its side after the request (``nc -N``, some probes) still gets the
        # answer: keep the transport while one is being made; with nothing asked yet, close.
        return self.served

    def _answer_bad(self, exc: _BadRequest) -> None:
        self.served = True
        self._buf = bytearray()
        self._send(_encode(exc.status, exc.text.encode(), "text/plain; charset=utf-8", False, **exc.headers))

    async def _respond(self, head: _Head) -> None:
        path = unquote(head.target.partition("?")[0])
        try:
            r = await self.server.handler(path, head.headers)
        except Exception:
            log.exception("The HTTP handler failed on %s", path)
            r = Response(500, b"internal error\n")
        self._send(_encode(r.status, r.body, r.content_type, head.method == "HEAD"))

    def _send(self, data: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(data)
        transport.close()  # flushes what is buffered, then closes; CONNECTION_TIMEOUT aborts a peer not reading

    def _deadline(self) -> None:
        transport = self.transport
        if transport is None or (transport.is_closing() and not transport.get_write_buffer_size()):
            return
        if self.served and time.monotonic() - self.created < CONNECTION_TIMEOUT:
            self.timer = asyncio.get_running_loop().call_later(CONNECTION_TIMEOUT - HEAD_TIMEOUT, self._deadline)
            return
        self.server.stats.timed_out += 1
        transport.abort()  # connection_lost follows and frees the slot

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self.server.live.discard(self)


@dataclass
class _Stats:
    refused: int = 0
    evicted: int = 0
    timed_out: int = 0
    last_warning: float = field(default=-_WARN_EVERY)


class _Server:
    """The protocol factory: a connection cap, eviction of idle connections, and per-connection deadlines."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.live: set[_Connection] = set()
        self.stats = _Stats()

    def __call__(self) -> asyncio.Protocol:
        self._forget_stale()
        if len(self.live) >= MAX_CONNECTIONS:
            self._evict_idle()
        if len(self.live) >= MAX_CONNECTIONS:
            self.stats.refused += 1
            self._warn()
            return _Refuse()
        conn = _Connection(self)
        self.live.add(conn)
        return conn

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
        for conn in [c for c in self.live if c.transport is None and c.created < limit]:
            self.live.discard(conn)

    def _evict_idle(self) -> None:
        # The oldest connection that has not sent a request yet makes room for the new
        # one: a fresh probe gets in at once even while idle connections fill every
        # slot, and a request being answered is never cut off.
        idle = [c for c in self.live if not c.served and c.transport is not None]
        if not idle:
            return
        conn = min(idle, key=lambda c: c.created)
        self.live.discard(conn)
        if conn.timer is not None:
            conn.timer.cancel()
        assert conn.transport is not None
        conn.transport.abort()
        self.stats.evicted += 1
        self._warn()


class HttpServer:
    """A running HTTP listener, as returned by :func:`start_http`."""

    def __init__(self, server: asyncio.Server, factory: _Server) -> None:
        self._server = server
        self._factory = factory

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` actually bound."""
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    @property
    def open_connections(self) -> int:
        """Connections currently open (at most :data:`MAX_CONNECTIONS`)."""
        return len(self._factory.live)

    @property
    def refused(self) -> int:
        """Connections refused because :data:`MAX_CONNECTIONS` were open."""
        return self._factory.stats.refused

    @property
    def evicted(self) -> int:
        """Idle connections dropped to make room for a new one at :data:`MAX_CONNECTIONS`."""
        return self._factory.stats.evicted

    @property
    def timed_out(self) -> int:
        """Connections aborted by :data:`HEAD_TIMEOUT` or :data:`CONNECTION_TIMEOUT`."""
        return self._factory.stats.timed_out

    async def close(self) -> None:
        """Stop listening and close every connection (in-flight requests get 1 s)."""
        self._server.close()
        tasks = [c.task for c in self._factory.live if c.task is not None and not c.task.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        for conn in list(self._factory.live):
            if conn.transport is not None:
                conn.transport.abort()
            if conn.task is not None:
                conn.task.cancel()
        self._factory.live.clear()
        await self._server.wait_closed()


async def start_http(listen: str, handler: Handler) -> HttpServer:
    """Serve ``handler`` on ``listen`` (``host:port``; port 0 picks a free one), within the limits above.

    Raises:
        ConfigError: ``listen`` is malformed.
        ReloaddError: the address cannot be bound (in use, not local).
    """
    host, port = parse_listen(listen)
    factory = _Server(handler)
    loop = asyncio.get_running_loop()
    try:
        server = await loop.create_server(factory, host, port, reuse_address=True, backlog=_BACKLOG)
    except OSError as exc:
        raise ReloaddError(f"Failed to listen on {listen} (metrics_listen): {exc.strerror or exc}") from exc
    for addr in _addresses(server):
        log.info("Serving /metrics, /healthz and /readyz on http://%s:%d", *addr)
    return HttpServer(server, factory)


def _addresses(server: asyncio.Server) -> Iterator[tuple[str, int]]:
    for sock in server.sockets:
        addr = sock.getsockname()
        yield (f"[{addr[0]}]" if ":" in addr[0] else addr[0]), addr[1]
