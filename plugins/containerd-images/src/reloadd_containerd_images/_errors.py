"""Errors of the containerd-images consumer, and the mapping of gRPC failures onto them.

::

    reloadd.TransientError
    └── ContainerdUnavailable   socket missing, refused, stream cut, UNAVAILABLE
    reloadd.PermanentError
    └── BadImageFile            the file cannot be imported as it is (format, missing blob, ...)
        └── TruncatedFile       the file ends early; imported again when it changes
"""

from __future__ import annotations

import asyncio

from grpclib.const import Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from reloadd import PermanentError, TransientError

__all__ = ["BadImageFile", "ContainerdUnavailable", "TruncatedFile", "is_status", "map_grpc_error"]

_TRANSIENT = {
    Status.UNAVAILABLE,
    Status.DEADLINE_EXCEEDED,
    Status.CANCELLED,
    Status.ABORTED,
    Status.RESOURCE_EXHAUSTED,
    Status.INTERNAL,
    Status.UNKNOWN,
}


class ContainerdUnavailable(TransientError):
    """containerd could not be reached or dropped the call; worth retrying."""


class BadImageFile(PermanentError):
    """The file is not an importable image archive; retrying cannot help until it changes."""


class TruncatedFile(BadImageFile):
    """The file ends early (probably still being written); imported again when it changes."""


def is_status(exc: BaseException, *codes: Status) -> bool:
    """Whether ``exc`` is a :class:`GRPCError` with one of ``codes``."""
    return isinstance(exc, GRPCError) and exc.status in codes


def map_grpc_error(exc: BaseException, what: str) -> Exception:
    """Map a transport or gRPC error from containerd onto the reloadd error tree.

    Args:
        exc: What grpclib (or the socket) raised.
        what: The operation, for the message (``"Content.Write sha256:..."``).

    Returns:
        A :class:`ContainerdUnavailable` for connection problems and retryable codes,
        a :class:`BadImageFile` for codes that say the input is wrong.
    """
    if isinstance(exc, GRPCError):
        msg = f"{what}: {exc.status.name} {exc.message or ''}".rstrip()
        if exc.status in _TRANSIENT or (exc.status == Status.NOT_FOUND and "lease" in (exc.message or "")):
            return ContainerdUnavailable(msg)
        return BadImageFile(msg)
    if isinstance(exc, (OSError, StreamTerminatedError, ProtocolError, asyncio.TimeoutError, EOFError)):
        return ContainerdUnavailable(f"{what}: containerd unavailable: {exc.__class__.__name__}: {exc}")
    return ContainerdUnavailable(f"{what}: {exc.__class__.__name__}: {exc}")
