"""A grpclib channel whose socket writes are joined per event-loop turn.

grpclib hands every HTTP/2 frame to the transport on its own, and containerd's gRPC server
allows frames of at most 16 KiB: a 1 MiB ``Content.Write`` message became 64 ``send()``
system calls. Measured on containerd 1.7 with the 551 MB benchmark archive, that was ~34,000
sends and ~6 s of client CPU per import; joining the frames written in one loop turn into
one write brings it to ~3,000 sends and ~3.5–4 s, which leaves the second core to containerd.
Order is kept (one buffer, flushed in order); nothing waits longer than the current turn.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from grpclib.client import Channel
from grpclib.protocol import H2Protocol

__all__ = ["CoalescingTransport", "coalescing_channel"]


class CoalescingTransport:
    """Wraps an asyncio transport: writes made in one loop turn reach the socket as one.

    Everything but :meth:`write`, :meth:`close` and :meth:`abort` is the wrapped
    transport's (``get_extra_info``, ``is_closing``, flow control through the protocol).
    """

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._pending: list[bytes] = []
        self._scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data``; the queue is written at the end of this loop turn."""
        if not data:
            return
        self._pending.append(bytes(data))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Hand everything queued to the transport now."""
        self._scheduled = False
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        """Write what is queued, then close (asyncio still sends its own buffer first)."""
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        """Drop what is queued and close at once."""
        self._pending.clear()
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _CoalescingProtocol(H2Protocol):
    def connection_made(self, transport: Any) -> None:
        super().connection_made(cast(asyncio.BaseTransport, CoalescingTransport(transport)))


class _CoalescingChannel(Channel):
    def _protocol_factory(self) -> H2Protocol:
        # grpclib 0.4's factory, with our protocol class (same handler and configs)
        base = super()._protocol_factory()
        return _CoalescingProtocol(base.handler, base.config, base.h2_config)


def coalescing_channel(path: str) -> Channel:
    """A grpclib :class:`Channel` to the unix socket ``path`` with joined writes."""
    return _CoalescingChannel(path=path)
