"""HTTP/1.1 to one API server over asyncio streams: a small keep-alive pool and streamed watches.

The Kubernetes client needs a narrow slice of HTTP: a request with a JSON body and the whole answer, and a
watch whose answer is a stream of newline-framed JSON. aiohttp did both, and cost every node ~10 MiB of
imports (its parser, cookie jar, multipart, websocket and two TLS contexts made at import). This module does
that slice and nothing else:

* ``Content-Length`` and ``chunked`` bodies, or a body up to the connection's end; no compression asked
  for, no redirects followed, no proxies, no cookies;
* a pool of at most ``limit`` kept-alive connections for requests (a request beyond it waits for one);
  an idle connection is closed after ``idle`` seconds, well before a server's own idle timeout would cut it
  under a request, and one the server has closed is never reused; nothing is re-sent here (a connection
  lost under a request is the caller's to judge: :class:`Disconnected`);
* a watch gets a connection of its own, closed when it ends (it never holds a pooled slot).

Failures are mapped here: :class:`ConnectFailed` (no connection: refused, unresolvable, TLS handshake),
:class:`Disconnected` (the connection was lost or the answer was malformed after the request went out),
:class:`TimeoutError` (the deadline passed). Any other ``OSError`` is mapped to one of the two.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlencode, urlsplit

__all__ = ["ConnectFailed", "Disconnected", "HttpError", "Response", "Transport"]

MAX_HEAD = 64 * 1024
"""Bytes in a response's status line and header fields together."""
MAX_BODY = 256 << 20
"""Bytes in one response body (a whole-list answer of a large cluster is tens of MiB)."""


class HttpError(Exception):
    """A request got no HTTP answer."""


class ConnectFailed(HttpError):
    """No connection could be made (refused, unresolvable, TLS handshake failed): the server is not there."""


class Disconnected(HttpError):
    """The connection was lost, or the answer was malformed, after the request was sent."""


@dataclass
class Response:
    """A response's status and header fields (names in lower case, in the order received)."""

    status: int
    fields: list[tuple[str, str]] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        """The first value of ``name``, or ``None``."""
        return next((v for k, v in self.fields if k == name), None)

    def all(self, name: str) -> list[str]:
        """Every value of ``name``."""
        return [v for k, v in self.fields if k == name]


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = time.monotonic()

    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.transport.abort()


class Transport:
    """Requests to the server at ``base`` (``https://host:port`` or ``http://...``).

    Args:
        base: The server URL (a path prefix is kept).
        tls: TLS context for ``https``; ``None`` for plain HTTP.
        server_hostname: The TLS server name when it is not the URL's host.
        headers: Sent with every request (``User-Agent``).
        limit: Pooled connections at most (requests beyond wait for one).
        idle: Seconds a pooled connection may stay unused before it is closed.
    """

    def __init__(self, base: str, tls: ssl.SSLContext | None, *, server_hostname: str | None = None,
                 headers: Mapping[str, str] | None = None, limit: int = 16, idle: float = 15.0) -> None:
        url = urlsplit(base)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) server URL: {base!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.prefix = url.path.rstrip("/")
        self.tls = tls if url.scheme == "https" else None
        if url.scheme == "https" and self.tls is None:
            self.tls = ssl.create_default_context()
        self.server_hostname = server_hostname or self.host
        authority = f"[{self.host}]" if ":" in self.host else self.host
        if url.port:
            authority += f":{url.port}"
        self._fixed = {"Host": authority, **(headers or {})}
        self.limit = limit
        self.idle = idle
        self._idle: list[_Conn] = []
        self._busy = 0
        self._freed = asyncio.Condition()
        self._reaper: asyncio.TimerHandle | None = None

    # -- connections --------------------------------------------------------------------------------------

    async def _connect(self) -> _Conn:
        try:
            reader, writer = await asyncio.open_connection(
                self.host, self.port, ssl=self.tls,
                server_hostname=self.server_hostname if self.tls is not None else None,
                limit=MAX_HEAD)
        except (OSError, ssl.SSLError, ssl.CertificateError) as exc:
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        return _Conn(reader, writer)

    async def _acquire(self) -> _Conn | None:
        """A pooled idle connection, or ``None`` when a new one may be opened (a slot is taken either way)."""
        async with self._freed:
            while True:
                while self._idle:
                    conn = self._idle.pop()
                    if conn.usable():
                        self._busy += 1
                        return conn
                    conn.close()
                if self._busy < self.limit:
                    self._busy += 1
                    return None
                await self._freed.wait()

    async def _release(self, conn: _Conn | None) -> None:
        async with self._freed:
            self._busy -= 1
            if conn is not None and conn.usable():
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
                self._schedule_reap()
            elif conn is not None:
                conn.close()
            self._freed.notify()

    def _schedule_reap(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().call_later(self.idle, self._reap)

    def _reap(self) -> None:
        self._reaper = None
        limit = time.monotonic() - self.idle
        keep = []
        for conn in self._idle:
            if conn.idle_since <= limit or not conn.usable():
                conn.close()
            else:
                keep.append(conn)
        self._idle = keep
        if keep:
            self._schedule_reap()

    async def close(self) -> None:
        """Close every pooled connection."""
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    # -- requests -----------------------------------------------------------------------------------------

    def _head(self, method: str, path: str, params: Mapping[str, str] | None, headers: Mapping[str, str],
              body: bytes | None) -> bytes:
        target = self.prefix + path
        if params:
            target += ("&" if "?" in target else "?") + urlencode(params)
        lines = [f"{method} {target} HTTP/1.1"]
        lines += [f"{k}: {v}" for k, v in {**self._fixed, **headers}.items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def request(self, method: str, path: str, *, params: Mapping[str, str] | None = None,
                      headers: Mapping[str, str] | None = None, body: bytes | None = None,
                      timeout: float | None = None) -> tuple[Response, bytes]:
        """Send one request and read its whole answer, within ``timeout`` seconds in all."""
        head = self._head(method, path, params, headers or {}, body)
        async with asyncio.timeout(timeout):
            conn = await self._acquire()
            kept: _Conn | None = None
            try:
                if conn is None:
                    conn = await self._connect()
                try:
                    conn.writer.write(head + (body or b""))
                    await conn.writer.drain()
                    resp, data, keep = await _read_answer(conn.reader, method)
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
                    raise _lost(exc) from exc
                if keep:
                    kept = conn
                return resp, data
            finally:
                if conn is not None and kept is None:
                    conn.close()
                await asyncio.shield(self._release(kept))

    @contextlib.asynccontextmanager
    async def stream(self, path: str, *, params: Mapping[str, str] | None = None,
                     headers: Mapping[str, str] | None = None, connect_timeout: float | None = None,
                     read_timeout: float | None = None) -> AsyncIterator[tuple[Response, AsyncIterator[bytes]]]:
        """GET ``path`` on a connection of its own: its response head, and its body as it arrives.

        A read waiting longer than ``read_timeout`` raises :class:`TimeoutError`; the connection is closed
        when the block ends.
        """
        async with asyncio.timeout(connect_timeout):
            conn = await self._connect()
        try:
            try:
                conn.writer.write(self._head("GET", path, params, headers or {}, None))
                async with asyncio.timeout(read_timeout):
                    resp, framing = await _read_head(conn.reader)
            except TimeoutError:
                raise
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
                raise _lost(exc) from exc
            yield resp, _body_stream(conn.reader, framing, read_timeout)
        finally:
            conn.close()


def _lost(exc: BaseException) -> Disconnected:
    """``exc``, met after the request went out, as the :class:`Disconnected` it means."""
    if isinstance(exc, asyncio.IncompleteReadError):
        return Disconnected("Server disconnected" + (" in the middle of its answer" if exc.partial else ""))
    if isinstance(exc, asyncio.LimitOverrunError | ValueError):
        return Disconnected(f"Server sent a malformed answer: {exc}")
    return Disconnected(f"Server disconnected: {type(exc).__name__}: {exc}")


async def _read_head(reader: asyncio.StreamReader) -> tuple[Response, tuple[str, int]]:
    """The status line and header fields; the body's framing: ``("chunked", 0)``, ``("length", n)`` or
    ``("close", 0)``."""
    line = await reader.readuntil(b"\n")
    parts = line.decode("latin-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP/1.x status line: {line[:80]!r}")
    resp = Response(int(parts[1]))
    size = len(line)
    while True:
        line = await reader.readuntil(b"\n")
        size += len(line)
        if size > MAX_HEAD:
            raise ValueError(f"a response head over {MAX_HEAD} bytes")
        text = line.decode("latin-1").rstrip("\r\n")
        if not text:
            break
        name, sep, value = text.partition(":")
        if not sep:
            raise ValueError(f"a malformed header field: {text[:80]!r}")
        resp.fields.append((name.strip().lower(), value.strip()))
    if "chunked" in (resp.header("transfer-encoding") or "").lower():
        return resp, ("chunked", 0)
    length = resp.header("content-length")
    if length is not None:
        if not length.strip().isdigit():
            raise ValueError(f"a malformed Content-Length: {length!r}")
        return resp, ("length", int(length))
    if resp.status in (204, 304) or 100 <= resp.status < 200:
        return resp, ("length", 0)
    return resp, ("close", 0)


async def _read_answer(reader: asyncio.StreamReader, method: str) -> tuple[Response, bytes, bool]:
    """The whole answer, and whether the connection can carry another request."""
    resp, (framing, length) = await _read_head(reader)
    keep = framing != "close" and "close" not in (resp.header("connection") or "").lower()
    if method == "HEAD":
        return resp, b"", keep
    if framing == "length":
        if length > MAX_BODY:
            raise ValueError(f"a response body of {length} bytes (over {MAX_BODY})")
        return resp, await reader.readexactly(length), keep
    parts = []
    size = 0
    async for chunk in _body_stream(reader, (framing, length), None):
        size += len(chunk)
        if size > MAX_BODY:
            raise ValueError(f"a response body over {MAX_BODY} bytes")
        parts.append(chunk)
    return resp, b"".join(parts), keep


async def _body_stream(reader: asyncio.StreamReader, framing: tuple[str, int],
                       read_timeout: float | None) -> AsyncIterator[bytes]:
    """The body's bytes as they arrive (chunk extensions and trailers skipped)."""
    kind, length = framing
    try:
        if kind == "length":
            while length > 0:
                async with asyncio.timeout(read_timeout):
                    data = await reader.read(min(length, 1 << 16))
                if not data:
                    raise asyncio.IncompleteReadError(b"", length)
                length -= len(data)
                yield data
        elif kind == "close":
            while True:
                async with asyncio.timeout(read_timeout):
                    data = await reader.read(1 << 16)
                if not data:
                    return
                yield data
        else:
            while True:
                async with asyncio.timeout(read_timeout):
                    line = await reader.readuntil(b"\n")
                size_text = line.split(b";", 1)[0].strip()
                size = int(size_text, 16)
                if size == 0:
                    while (await reader.readuntil(b"\n")).strip():
                        pass  # trailer fields
                    return
                left = size
                while left > 0:
                    async with asyncio.timeout(read_timeout):
                        data = await reader.read(min(left, 1 << 16))
                    if not data:
                        raise asyncio.IncompleteReadError(b"", left)
                    left -= len(data)
                    yield data
                if (await reader.readexactly(2)) != b"\r\n":
                    raise ValueError("a chunk not followed by CRLF")
    except TimeoutError:
        raise
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
        raise _lost(exc) from exc
