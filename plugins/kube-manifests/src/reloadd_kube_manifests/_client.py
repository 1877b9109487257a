"""A small async REST client for the Kubernetes API, on :mod:`._transport` (HTTP/1.1 over asyncio streams).

It does exactly what the applier needs and maps every HTTP outcome at this boundary::

    ApiError (PermanentError)       a definite answer the same request cannot change (4xx, 500)
     └─ RequestDropped               the server dropped the connection on this request N times in a row
    ApiUnavailable (TransientError) 429/502/503/504 or connection loss, still failing after retries

429 and 5xx overload answers (and connection loss) are retried here with exponential backoff and jitter,
honouring ``Retry-After`` (capped). A 401 reloads the credentials once (rotated tokens, expired exec tokens).

A server that accepts the connection and then drops it, on the same request, several times in a row while
it answers other requests is not overloaded: the request itself crashes its handler (kube-apiserver v1.20
panics on a server-side apply of an ``APIService``). Retrying it forever only crashes the handler again, so
after ``drop_limit`` such drops in a row the request fails with :class:`RequestDropped`, a permanent error.
After each drop the server is asked for ``/version``; a drop while the server does not answer that (killed,
restarting, a load balancer without backends), a failure to connect, or any answer breaks the run.

``Warning:`` response headers (RFC 7234 style, ``299 - "text"``; deprecated APIs) are parsed and handed to
the caller that asks for them.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from reloadd import Backoff, PermanentError, TransientError

from ._kubeconfig import ClusterConfig
from ._transport import ConnectFailed, Disconnected, HttpError, Transport

__all__ = ["APPLY_PATCH", "ApiError", "ApiUnavailable", "KubeClient", "RequestDropped", "parse_warning"]

APPLY_PATCH = "application/apply-patch+yaml"
_RETRY_STATUSES = frozenset({429, 502, 503, 504})


class ApiError(PermanentError):
    """The API server answered with an error status.

    Attributes:
        status: HTTP status code.
        reason: ``Status.reason`` (``Conflict``, ``Invalid``, ``Forbidden``...) or ``""``.
        message: ``Status.message`` or the plain-text body.
        causes: ``Status.details.causes``.
        plain: True when the body was not a JSON ``Status`` (e.g. a plain ``404 page not found`` for a
            group/version the server does not serve).
    """

    def __init__(self, status: int, reason: str, message: str, causes: list[Any], plain: bool) -> None:
        super().__init__(f"{status} {reason + ': ' if reason else ''}{message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.causes = causes
        self.plain = plain

    @property
    def field_conflict(self) -> bool:
        """A server-side-apply conflict with another field manager."""
        return self.status == 409 and any(
            isinstance(c, Mapping) and c.get("reason") == "FieldManagerConflict" for c in self.causes
        )

    @property
    def not_served(self) -> bool:
        """A 404 for the URL itself: the group/version (or resource) is not served."""
        return self.status == 404 and self.plain


class RequestDropped(ApiError):
    """The server dropped the connection on the same request several times in a row.

    Attributes:
        drops: How many times in a row.
    """

    def __init__(self, message: str, drops: int) -> None:
        super().__init__(0, "", message, [], True)
        self.drops = drops
        self.args = (f"the server dropped the connection {drops} times in a row: {message}",)


class ApiUnavailable(TransientError):
    """The API server was unreachable or overloaded through every retry.

    Attributes:
        last: The last failure alone, e.g. ``503 service unavailable`` (the message adds request and tries).
        retry_after: The server's last ``Retry-After``, in seconds, if it sent one.
    """

    def __init__(self, message: str, last: str = "", retry_after: float | None = None) -> None:
        super().__init__(message, retry_after=retry_after)
        self.last = last or message


_WARNING = re.compile(r'^\s*\d{3}\s+\S+\s+"((?:[^"\\]|\\.)*)"')


def parse_warning(value: str) -> str:
    """The text of a ``Warning`` header value (``299 - "text"`` → ``text``); the raw value if malformed."""
    match = _WARNING.match(value)
    if match is None:
        return value.strip()
    return re.sub(r"\\(.)", r"\1", match.group(1))


def _dropped(exc: BaseException) -> bool:
    """Whether ``exc`` means the server took the request and then closed the connection."""
    if isinstance(exc, ConnectFailed):
        return False  # never connected: the server is down or restarting
    return isinstance(exc, Disconnected)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _error(status: int, text: str) -> ApiError:
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, Mapping) and body.get("kind") == "Status":
        details = body.get("details") or {}
        causes = details.get("causes") or [] if isinstance(details, Mapping) else []
        return ApiError(status, str(body.get("reason") or ""), str(body.get("message") or ""), causes, False)
    return ApiError(status, "", text.strip()[:500], [], True)


class KubeClient:
    """Requests against one API server with retries.

    Args:
        config: Server, TLS and credentials.
        user_agent: Sent with every request.
        attempts: Tries per request for retryable failures.
        drop_limit: Connection drops in a row on one request that make it a :class:`RequestDropped`.
        backoff: First retry delay in seconds (doubled each time, with jitter).
        max_delay: Cap on any one delay, ``Retry-After`` included.
        timeout: Seconds for one HTTP exchange.
        sleep: Injectable for tests.
        fence: Asked before every write (POST, PUT, PATCH, DELETE; dry runs too); a write it refuses
            raises :class:`ApiUnavailable` unsent (leader election: a standby, or a leader past its
            renew deadline, writes nothing).
    """

    def __init__(
        self,
        config: ClusterConfig,
        *,
        user_agent: str = "reloadd",
        attempts: int = 6,
        drop_limit: int = 3,
        backoff: float = 0.2,
        max_delay: float = 30.0,
        timeout: float = 30.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        fence: Callable[[], bool] | None = None,
    ) -> None:
        self.config = config
        self.fence = fence
        self.user_agent = user_agent
        self.attempts = attempts
        self.drop_limit = drop_limit
        self.backoff = backoff
        self.max_delay = max_delay
        self._backoff = Backoff(backoff, max_delay)
        self.timeout = timeout
        self._sleep = sleep
        self._transport: Transport | None = None
        self.stats: dict[str, float] = {"requests": 0, "retries": 0, "dropped": 0}

    def _get_transport(self) -> Transport:
        if self._transport is None:
            self._transport = Transport(self.config.server, self.config.ssl,
                                        server_hostname=self.config.server_hostname,
                                        headers={"User-Agent": self.user_agent})
        return self._transport

    async def close(self) -> None:
        """Close the connection pool."""
        if self._transport is not None:
            await self._transport.close()
            self._transport = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        attempts: int | None = None,
        warnings: list[str] | None = None,
    ) -> Any:
        """Send a request and return the parsed JSON body.

        Args:
            method: HTTP method.
            path: URL path on the server.
            params: Query parameters.
            body: JSON-able request body.
            content_type: Of the body.
            attempts: Overrides the client's tries for this request (1 = no retry).
            warnings: When given, the texts of the final response's ``Warning`` headers are appended.

        Raises:
            ApiError: for an error status that retrying cannot change.
            RequestDropped: when the server dropped the connection ``drop_limit`` times in a row.
            ApiUnavailable: when every attempt met a connection error, 429 or 502/503/504.
        """
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        limit = self.attempts if attempts is None else max(1, attempts)
        reauthed = False
        attempt = 0
        drops = 0
        while True:
            attempt += 1
            delay: float | None
            if self.fence is not None and method != "GET" and not self.fence():
                raise ApiUnavailable(f"{method} {path}: not sent: this process does not hold the Lease (standby)",
                                     "standby")
            headers = await self._headers()
            if data is not None:
                headers["Content-Type"] = content_type
            self.stats["requests"] += 1
            try:
                resp, raw = await self._get_transport().request(
                    method, path, params=params, headers=headers, body=data, timeout=self.timeout)
                text = raw.decode("utf-8", "replace")
                status = resp.status
                retry_after = _retry_after(resp.header("retry-after"))
                warned = [parse_warning(v) for v in resp.all("warning")]
            except (HttpError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}"
                delay = None
                if _dropped(exc) and await self._alive():
                    drops += 1
                    self.stats["dropped"] += 1
                    if drops >= self.drop_limit:
                        raise RequestDropped(last, drops) from exc
                else:
                    drops = 0  # the server itself is down (or restarting): not this request's fault
            else:
                drops = 0
                if warnings is not None and status != 401:
                    warnings.extend(w for w in warned if w not in warnings)
                if status < 300:
                    return json.loads(text) if text else None
                if status == 401 and not reauthed:
                    reauthed = True
                    self.config.auth.invalidate()
                    attempt -= 1
                    continue
                if status not in _RETRY_STATUSES:
                    raise _error(status, text)
                last = str(_error(status, text))
                delay = retry_after
            if attempt >= limit:
                raise ApiUnavailable(f"{method} {path}: {last} (gave up after {attempt} attempts)", last, delay)
            if delay is None:
                delay = self._backoff.delay(attempt)
            self.stats["retries"] += 1
            await self._sleep(min(delay, self.max_delay))

    async def _headers(self) -> dict[str, str]:
        """Accept JSON, with the current credentials (refreshed by the auth provider when due)."""
        headers = {"Accept": "application/json"}
        auth = await self.config.auth.header()
        if auth:
            headers["Authorization"] = auth
        return headers

    async def _alive(self) -> bool:
        """Whether the server answers a cheap request (``/version``, readable by anyone) with any status.

        Asked after a dropped connection: a server that answers dropped *that request*; one that does not
        (killed, restarting, or a load balancer with no backend left) is down, which is no request's fault.
        """
        self.stats["requests"] += 1
        try:
            await self._get_transport().request("GET", "/version", timeout=5.0)
        except (HttpError, TimeoutError):
            return False
        return True

    async def watch(self, path: str, params: Mapping[str, str], *, read_timeout: float,
                    max_event: int = 64 << 20) -> AsyncIterator[dict[str, Any]]:
        """Open a watch on the collection at ``path`` and yield its events (``{"type", "object"}``) until the
        server ends the stream (its ``timeoutSeconds``): one request, no retry; the caller resumes.

        Events are newline-framed JSON; a line may span chunks (read whole up to ``max_event`` bytes).

        Raises:
            ApiError: an error status (410 when the ``resourceVersion`` is too old, 403...).
            ApiUnavailable: no connection, a dropped one, 429/5xx, or ``read_timeout`` seconds of silence.
        """
        headers = await self._headers()
        self.stats["requests"] += 1
        try:
            async with self._get_transport().stream(
                path, params={**params, "watch": "1"}, headers=headers, connect_timeout=self.timeout,
                read_timeout=read_timeout,
            ) as (resp, body):
                if resp.status == 401:
                    self.config.auth.invalidate()
                if resp.status >= 300:
                    text = b"".join([chunk async for chunk in body]).decode("utf-8", "replace")
                    if resp.status in _RETRY_STATUSES or resp.status == 401:
                        raise ApiUnavailable(f"WATCH {path}: {_error(resp.status, text)}",
                                             retry_after=_retry_after(resp.header("retry-after")))
                    raise _error(resp.status, text)
                buf = b""
                async for chunk in body:
                    buf += chunk
                    while (end := buf.find(b"\n")) >= 0:
                        line, buf = buf[:end], buf[end + 1:]
                        if line.strip():
                            event = json.loads(line)
                            if isinstance(event, dict):
                                yield event
                    if len(buf) > max_event:
                        raise ApiUnavailable(f"WATCH {path}: an event over {max_event} bytes")
        except (HttpError, TimeoutError, ValueError) as exc:
            raise ApiUnavailable(f"WATCH {path}: {type(exc).__name__}: {exc}") from exc

    async def get(self, path: str, params: Mapping[str, str] | None = None, *, attempts: int | None = None) -> Any:
        """GET ``path`` (``attempts`` overrides the client's tries)."""
        return await self.request("GET", path, params=params, attempts=attempts)

    async def apply(
        self,
        path: str,
        obj: Mapping[str, Any],
        *,
        manager: str,
        force: bool,
        dry_run: bool,
        warnings: list[str] | None = None,
    ) -> Any:
        """Server-side apply ``obj`` at its object URL ``path`` (creates it when missing).

        ``warnings``, when given, receives the server's ``Warning`` header texts (deprecated APIs).
        """
        params = {"fieldManager": manager}
        if force:
            params["force"] = "true"
        if dry_run:
            params["dryRun"] = "All"
        return await self.request("PATCH", path, params=params, body=obj, content_type=APPLY_PATCH,
                                  warnings=warnings)

    async def delete(self, path: str, *, uid: str | None, dry_run: bool) -> None:
        """Delete the object at ``path`` (background propagation, guarded by ``uid``); 404 is success."""
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background",
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        params = {"dryRun": "All"} if dry_run else None
        try:
            await self.request("DELETE", path, params=params, body=body)
        except ApiError as exc:
            if exc.status != 404:
                raise
