"""The systemd notification protocol (``sd_notify(3)``), without libsystemd.

The protocol is one ``AF_UNIX`` datagram of newline-separated ``KEY=value`` lines sent
to the socket named by ``$NOTIFY_SOCKET`` (a leading ``@`` means the abstract
namespace). The service manager reads ``READY=1`` (start-up finished), ``WATCHDOG=1``
(still alive; due every ``$WATCHDOG_USEC`` microseconds), ``STOPPING=1`` and
``STATUS=...`` (the text ``systemctl status`` shows).

Sending never raises: a daemon must not die because its supervisor went away, so a
failed send is logged once and otherwise ignored.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

__all__ = ["Notifier", "watchdog_interval"]

log = logging.getLogger("reloadd.sdnotify")


def _address(raw: str) -> str | bytes | None:
    if raw.startswith("@"):
        return b"\0" + raw[1:].encode()
    if raw.startswith("/"):
        return raw
    return None  # vsock and other address families are not used by systemd for services


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings: half of ``$WATCHDOG_USEC``, or ``None`` when off.

    ``$WATCHDOG_PID``, when set, must name this process (systemd sets it so that a
    child inheriting the environment does not ping on the parent's behalf).
    """
    env = os.environ if env is None else env
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec:
        return None
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        log.warning("Ignoring WATCHDOG_USEC=%r: not an integer", usec)
        return None
    return value / 1e6 / 2 if value > 0 else None


class Notifier:
    """Send ``sd_notify`` datagrams to ``$NOTIFY_SOCKET``.

    Args:
        address: The socket (``/path`` or ``@abstract``); defaults to ``$NOTIFY_SOCKET``.
            Empty or absent: every send is a no-op.
    """

    def __init__(self, address: str | None = None) -> None:
        raw = os.environ.get("NOTIFY_SOCKET", "") if address is None else address
        self._raw = raw
        self._address = _address(raw) if raw else None
        if raw and self._address is None:
            log.warning("Ignoring NOTIFY_SOCKET=%r: not a unix socket path", raw)
        self._sock: socket.socket | None = None
        self._warned = False

    @property
    def enabled(self) -> bool:
        """Whether a notification socket is configured."""
        return self._address is not None

    def send(self, **fields: str | int) -> bool:
        """Send one datagram of ``KEY=value`` lines; return whether it was delivered.

        Example: ``notifier.send(READY=1, STATUS="watching 3 consumers")``.
        """
        if self._address is None or not fields:
            return False
        lines = []
        for key, value in fields.items():
            text = str(value).replace("\n", " ")  # a newline would start a new assignment
            lines.append(f"{key}={text}")
        payload = "\n".join(lines).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto(payload, self._address)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("Failed to notify the service manager at %s: %s", self._raw, exc)
            return False
        return True

    def close(self) -> None:
        """Close the sending socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
