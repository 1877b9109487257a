"""The control socket: the server a running daemon answers ``reloadd status`` and ``reloadd reload`` on.

The terminal side (asking, printing, exit codes) is :mod:`reloadd._ops._terminal`, used by the CLI only.

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
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import ConfigError, ReloaddError

if TYPE_CHECKING:
    from .._snapshot import Pipeline

__all__ = ["ControlServer", "redact", "request"]

log = logging.getLogger("reloadd.control")

_MAX_REQUEST = 64 * 1024
_TIMEOUT = 10.0

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
    """Serve status and reload requests for one pipeline.

    Args:
        reloader: The pipeline (a :class:`~reloadd.Reloader`).
        path: The socket path.
        extra: Returns more fields for the status document (e.g. the metrics address).
    """

    def __init__(
        self, reloader: Pipeline, path: Path, extra: Callable[[], dict[str, Any]] | None = None
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
        """The status document: the pipeline's snapshot (``ready`` as /readyz) plus process facts, redacted."""
        doc = self.reloader.snapshot(detail=True).status()
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
