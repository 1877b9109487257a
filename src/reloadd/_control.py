"""The control socket: ``reloadd status`` and ``reloadd reload`` talking to a running daemon.

A unix stream socket at ``[reloadd] control_socket``, mode 0600 from the moment it
exists (the mode is set on the socket before ``bind``), so only its owner (root, for a
node daemon) can read status or force a resync. The protocol is one JSON object per
line each way::

    -> {"command": "status"}
    <- {"ok": true, "status": {...}}
    -> {"command": "reload"}
    <- {"ok": true, "message": "..."}
    -> {"command": "confirm-prune", "consumer": null}
    <- {"ok": true, "message": "...", "released": 3}

Status carries paths and error messages, never consumer options. Error messages are
passed through :func:`redact` so credentials a plugin echoes in an error (a URL with
``user:password@``, ``token=...``) do not leak to the terminal or to scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ._errors import ConfigError, ReloaddError

if TYPE_CHECKING:
    from ._config import Config
    from ._reloader import Reloader

__all__ = ["ControlServer", "confirm_prune", "format_status", "query_status", "redact", "request", "send_reload"]

log = logging.getLogger("reloadd.control")

_MAX_REQUEST = 64 * 1024
_TIMEOUT = 10.0
_LIST_MAX = 10  # pending paths listed per consumer in the table

_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")
_SECRET_KV = re.compile(
    r"(?i)\b(?P<key>password|passwd|token|secret|api[_-]?key|authorization)(?P<sep>\s*[=:]\s*)"
    r"(?P<scheme>(?:bearer|basic)\s+)?[^\s,;&\"']+"
)


def redact(text: str) -> str:
    """Hide credentials in ``text``: URL user-info and ``password=``/``token:``-style values."""
    text = _URL_USERINFO.sub(r"\g<scheme>***@", text)
    return _SECRET_KV.sub(lambda m: f"{m['key']}{m['sep']}{m['scheme'] or ''}***", text)


def _redact_tree(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_tree(v) for v in value]
    return value


def _version() -> str:
    from ._metrics import _version as version

    return version()


class ControlServer:
    """Serve status and reload requests for one reloader.

    Args:
        reloader: The reloader.
        path: The socket path.
        extra: Returns more fields for the status document (e.g. the metrics address).
    """

    def __init__(
        self, reloader: Reloader, path: Path, extra: Callable[[], dict[str, Any]] | None = None
    ) -> None:
        self.reloader = reloader
        self.path = path
        self._extra = extra or dict
        self._server: asyncio.Server | None = None
        self._ino: int | None = None
        self._started = time.time()

    async def start(self) -> None:
        """Create the socket (0600) and start serving.

        Raises:
            ReloaddError: another process is serving the socket, the path is not a
                socket, or the socket cannot be created (``ConfigError`` for the second).
        """
        path = self.path
        try:
            if not path.parent.exists():
                path.parent.mkdir(parents=True, mode=0o700)
            _remove_stale(path)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:
            raise ReloaddError(f"Failed to create the control socket {path}: {exc.strerror or exc}") from exc
        try:
            os.fchmod(sock.fileno(), 0o600)  # Linux: bind() creates the file with this mode
            sock.bind(str(path))
            os.chmod(path, 0o600)
            self._ino = os.stat(path).st_ino
            self._server = await asyncio.start_unix_server(self._on_connection, sock=sock)
        except OSError as exc:
            sock.close()
            raise ReloaddError(f"Failed to create the control socket {path}: {exc.strerror or exc}") from exc
        except BaseException:
            sock.close()
            raise
        log.info("Serving status and reload on %s", path)

    async def close(self) -> None:
        """Stop serving and remove the socket (if it is still ours)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._ino:
                os.unlink(self.path)

    def status(self) -> dict[str, Any]:
        """The status document: the reloader's status plus process facts, redacted."""
        doc = self.reloader.status()
        now = time.time()
        for c in doc.get("consumers", {}).values():
            for f in c.get("failing", []):
                f["next_retry_at"] = round(now + float(f.get("retry_in", 0.0)), 3)
        doc.update({
            "version": _version(),
            "pid": os.getpid(),
            "started_at": round(self._started, 3),
            "config": str(self.reloader.config.source) if self.reloader.config.source else None,
            **self._extra(),
        })
        result: dict[str, Any] = _redact_tree(doc)
        return result

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), _TIMEOUT)
            reply = await self._dispatch(line)
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, TimeoutError, ValueError):
            pass
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("Failed to answer a control request: %s", exc, exc_info=exc)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _dispatch(self, line: bytes) -> dict[str, Any]:
        try:
            req = json.loads(line)
            command = req["command"]
        except (ValueError, KeyError, TypeError):
            return {"ok": False, "error": 'expected one JSON line like {"command": "status"}'}
        if command == "confirm-prune":
            consumer = req.get("consumer")
            try:
                n = await self.reloader.confirm_prune(consumer if isinstance(consumer, str) else None)
            except (RuntimeError, KeyError) as exc:
                return {"ok": False, "error": f"cannot confirm held removals: {exc}"}
            log.warning("Received confirm-prune on the control socket: running %d held removal(s)", n)
            return {"ok": True, "released": n, "message": f"running {n} held removal(s)"}
        if command == "status":
            return {"ok": True, "status": self.status()}
        if command == "reload":
            log.info("Received reload on the control socket: resyncing every consumer")
            try:
                self.reloader.trigger()
            except RuntimeError as exc:  # not started yet, or already shut down
                return {"ok": False, "error": f"cannot resync now: {exc}"}
            return {"ok": True, "message": "full resync requested"}
        return {"ok": False, "error": f"unknown command {command!r} (status, reload, confirm-prune)"}


def _remove_stale(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"[reloadd] control_socket: {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except OSError:
        os.unlink(path)  # nobody listening: left over from a crash
        return
    finally:
        probe.close()
    raise ReloaddError(f"Another reloadd is serving the control socket {path}")


# Client ------------------------------------------------------------------------------
def request(path: Path, command: str, timeout: float = _TIMEOUT, **fields: Any) -> dict[str, Any]:
    """Send one command to the daemon's control socket and return its reply.

    Raises:
        OSError: the socket cannot be reached.
        ReloaddError: the daemon answered with an error or garbage.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(json.dumps({"command": command, **fields}).encode() + b"\n")
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    try:
        reply = json.loads(b"".join(chunks))
    except ValueError as exc:
        raise ReloaddError(f"Malformed reply on {path}: {exc}") from exc
    if not isinstance(reply, dict) or not reply.get("ok"):
        error = reply.get("error") if isinstance(reply, dict) else reply
        raise ReloaddError(f"The daemon refused {command!r}: {error}")
    return reply


def send_reload(cfg: Config) -> bool:
    """Ask the daemon for a full resync over the control socket.

    Returns:
        True when the daemon acknowledged; False when no control socket is configured
        or nothing answers on it (the caller then falls back to SIGHUP via ``pid_file``).
    """
    if cfg.control_socket is None or not cfg.control_socket.exists():
        return False
    try:
        request(cfg.control_socket, "reload")
    except (OSError, ReloaddError) as exc:
        log.debug("Control socket %s did not take the reload: %s", cfg.control_socket, exc)
        return False
    return True


def confirm_prune(cfg: Config, consumer: str | None = None) -> int:
    """Ask the daemon to run every held removal (or one consumer's); the exit code for ``reload --confirm-prune``.

    Only the control socket can carry it (a signal cannot say "confirm"): 1 when none is configured
    or nothing answers.
    """
    if cfg.control_socket is None:
        print("reloadd: --confirm-prune needs control_socket under [reloadd]; cannot reach the daemon",
              file=sys.stderr)
        return 1
    try:
        reply = request(cfg.control_socket, "confirm-prune", consumer=consumer)
    except (OSError, ReloaddError) as exc:
        print(f"reloadd: cannot reach the daemon on {cfg.control_socket}: {exc}", file=sys.stderr)
        return 1
    print(f"reloadd: the daemon is {reply.get('message', 'running the held removals')}")
    return 0


def query_status(cfg: Config, as_json: bool = False, out: TextIO | None = None) -> int:
    """Print the running daemon's status; the exit code for ``reloadd status``.

    Returns:
        0 when the daemon is ready and no path is failing, 3 when it answered but is
        not ready or has failing, rejected or prune-held paths, 1 when it cannot be reached.
    """
    out = out or sys.stdout
    if cfg.control_socket is None:
        print("reloadd: no control_socket configured under [reloadd]; cannot reach the daemon",
              file=sys.stderr)
        return 1
    try:
        doc = request(cfg.control_socket, "status")["status"]
    except (OSError, ReloaddError, KeyError) as exc:
        print(f"reloadd: cannot reach the daemon on {cfg.control_socket}: {exc}", file=sys.stderr)
        return 1
    if as_json:
        json.dump(doc, out, indent=2, sort_keys=True)
        out.write("\n")
    else:
        out.write(format_status(doc))
    consumers = doc.get("consumers", {}).values()
    troubled = any(c.get("failing") or c.get("rejected") or c.get("prune_held") for c in consumers)
    return 0 if doc.get("ready") and not troubled else 3


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def _held_lines(lines: list[str], c: dict[str, Any], now: float) -> None:
    """``prune held: N objects of M path(s) (why, since when)``, one line per reason, then the paths."""
    held = c.get("prune_held") or []
    by_why: dict[str, list[dict[str, Any]]] = {}
    for h in held:
        by_why.setdefault(str(h.get("why")), []).append(h)
    unit = c.get("prune_held_unit", "files")
    for why, entries in by_why.items():
        size = sum(int(h.get("size", 0)) for h in entries)
        since = min(float(h.get("since", now)) for h in entries)
        lines.append(f"  PRUNE HELD: {size} {unit} of {len(entries)} path(s) ({why}, since {_clock(since)}, "
                     f"{_ago(now - since)} ago)")
        for h in entries[:_LIST_MAX]:
            lines.append(f"             {h['path']}")
        if len(entries) > _LIST_MAX:
            lines.append(f"             ... and {len(entries) - _LIST_MAX} more (--json lists all)")
    if held:
        lines.append("             run by `reloadd reload --confirm-prune`; the input coming back releases them")


def format_status(doc: dict[str, Any], now: float | None = None) -> str:
    """The human-readable status table."""
    now = time.time() if now is None else now
    lines = []
    up = _ago(now - doc["started_at"]) if doc.get("started_at") else "?"
    lines.append(
        f"reloadd {doc.get('version', '?')} (pid {doc.get('pid', '?')}, up {up}): "
        f"{'ready' if doc.get('ready') else 'NOT READY'}, watch {doc.get('watch', '?')}"
    )
    for problem in doc.get("ready_problems", []):
        lines.append(f"not ready: {problem}")
    if doc.get("metrics"):
        lines.append(f"metrics: {doc['metrics']}")
    for name, c in sorted(doc.get("consumers", {}).items()):
        last = c.get("last_success")
        last_s = f"{_ago(now - last)} ago" if last else "never"
        lines.append("")
        lines.append(f"consumer {name} ({c.get('plugin', '?')})")
        lines.append(f"  roots:     {', '.join(c.get('roots', [])) or '-'}")
        lines.append(
            f"  paths:     {c.get('records', 0)} known, {c.get('settling', 0)} settling, "
            f"{len(c.get('pending', []))} pending, {len(c.get('in_flight', []))} in flight, "
            f"{c.get('batches', 0)} batches, last success {last_s}"
        )
        for h in c.get("held", []):
            by = f" by pid {', '.join(map(str, h['writers']))}" if h.get("writers") else ""
            lines.append(f"  HELD:      {h['path']}: {h.get('why')}{by} for {_ago(float(h.get('held_for', 0)))} "
                         f"(others stopped waiting for it after max_delay; handed over at max_hold)")
        if c.get("oldest_pending_age"):
            lines.append(f"  waiting:   oldest for {_ago(c['oldest_pending_age'])}")
        if c.get("waiting_for"):
            lines.append(f"  after:     waits for {', '.join(c['waiting_for'])} to finish its work (`after`)")
        if c.get("held_groups"):
            lines.append(f"  group:     holding {'; '.join(c['held_groups'])} until every member settles")
        for p in c.get("in_flight", []):
            lines.append(f"  working:   {p}")
        failing = {f["path"] for f in c.get("failing", [])} | {d["path"] for d in c.get("deferred", [])}
        waiting = [p for p in c.get("pending", []) if p not in failing]
        for p in waiting[:_LIST_MAX]:
            lines.append(f"  pending:   {p}")
        if len(waiting) > _LIST_MAX:
            lines.append(f"  pending:   ... and {len(waiting) - _LIST_MAX} more (--json lists all)")
        for f in c.get("failing", []):
            at = f.get("next_retry_at")
            when = f"retry in {f.get('retry_in', 0):.1f}s" + (f" (at {_clock(at)})" if at else "")
            lines.append(f"  FAILING:   {f['path']}: attempt {f.get('attempts', '?')}, {when}")
            lines.append(f"             {f.get('error')}")
        for d in c.get("deferred", []):
            lines.append(f"  deferred:  {d['path']}: again in {d.get('retry_in', 0):.1f}s ({d.get('reason')})")
        _held_lines(lines, c, now)
        for rj in c.get("rejected", []):
            lines.append(f"  REJECTED:  {rj['path']} (not retried until it changes, or on SIGHUP / `reloadd reload`)")
            lines.append(f"             {rj.get('error')}")
    return "\n".join(lines) + "\n"
