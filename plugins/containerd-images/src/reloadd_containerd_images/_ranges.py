"""Reading one member of an uncompressed tarball by its offset, beside the archive's sequential walk.

A layer of an uncompressed archive need not come through :class:`~._archive.ArchiveReader`'s one
thread: its bytes are a range of the file, so several layers can be hashed and streamed into
containerd at once. Each range is read with ``pread`` from a duplicate of the reader's own file
descriptor (the file the walk opened, even if the path was replaced since), in the loop's executor,
the next chunk read while the current one is sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import os

from reloadd import TransientError

from ._errors import TruncatedFile

__all__ = ["RangeSource", "hash_range"]

CHUNK = 1 << 20


def _short(name: str) -> TruncatedFile:
    return TruncatedFile(f"file is truncated inside {name}; it is imported again when it changes")


def _read_error(exc: OSError) -> TransientError:
    return TransientError(f"cannot read file: {exc}")


class RangeSource:
    """A :class:`~._content.ChunkSource` over ``size`` bytes of the open file ``fd`` from ``offset``.

    Args:
        fd: A file descriptor the source does not own (the caller closes it after :meth:`close`).
        name: The member's name, for errors.
        offset: Where the member's data starts.
        size: Its length.
        chunk: Bytes per read.
    """

    def __init__(self, fd: int, name: str, offset: int, size: int, chunk: int = CHUNK) -> None:
        self.fd, self.name, self.offset, self.size, self.chunk = fd, name, offset, size, chunk
        self.head = b""
        self._pos = offset
        self._next: asyncio.Future[bytes] | None = None

    async def begin(self) -> None:
        """(Re)start at the range's first byte."""
        await self.close()
        self._pos = self.offset
        self._next = self._fetch()

    async def read(self) -> bytes:
        """The next chunk; ``b""`` at the end."""
        if self._next is None:
            return b""
        try:
            data = await self._next
        except OSError as exc:
            self._next = None
            raise _read_error(exc) from exc
        if len(data) < min(self.chunk, self.offset + self.size - self._pos):
            self._next = None
            raise _short(self.name)
        self.head = self.head or data[:16]
        self._pos += len(data)
        self._next = self._fetch()
        return data

    async def close(self) -> None:
        """Wait for a read still in flight (the descriptor may be closed after)."""
        if self._next is not None:
            nxt, self._next = self._next, None
            try:
                await nxt
            except OSError:
                pass

    def _fetch(self) -> asyncio.Future[bytes] | None:
        n = min(self.chunk, self.offset + self.size - self._pos)
        if n <= 0:
            return None
        return asyncio.get_running_loop().run_in_executor(None, os.pread, self.fd, n, self._pos)


def _hash(fd: int, name: str, offset: int, size: int, chunk: int) -> tuple[str, bytes]:
    h = hashlib.sha256()
    head = b""
    pos, end = offset, offset + size
    while pos < end:
        data = os.pread(fd, min(chunk, end - pos), pos)
        if not data:
            raise _short(name)
        h.update(data)
        head = head or data[:16]
        pos += len(data)
    return "sha256:" + h.hexdigest(), head


async def hash_range(fd: int, name: str, offset: int, size: int, chunk: int = CHUNK) -> tuple[str, bytes]:
    """SHA-256 and first 16 bytes of ``size`` bytes of ``fd`` from ``offset``, read and hashed in a thread."""
    try:
        return await asyncio.to_thread(_hash, fd, name, offset, size, chunk)
    except OSError as exc:
        raise _read_error(exc) from exc
