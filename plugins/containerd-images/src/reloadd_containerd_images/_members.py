"""Reading a tar member without writing it: its first bytes kept, or its digest found (``reloadd plan``)."""

from __future__ import annotations

import hashlib

from ._archive import ArchiveReader, Member
from ._content import WriteResult
from ._ranges import hash_range

__all__ = ["MemberSource", "hash_member"]


class MemberSource:
    """A :class:`ChunkSource` over the current tar member that keeps its first bytes."""

    def __init__(self, reader: ArchiveReader) -> None:
        self.reader = reader
        self.head = b""

    async def begin(self) -> None:
        await self.reader.begin()

    async def read(self) -> bytes:
        data = await self.reader.read()
        if len(self.head) < 16 and data:
            self.head += data[: 16 - len(self.head)]
        return data


async def hash_member(reader: ArchiveReader, m: Member, expected: str, fd: int) -> tuple[WriteResult, bytes]:
    """What ``_ingest``'s ``_write_member`` or ``_write_range`` would write, found reading only (``fd``: the
    tarball's, when the member can be read by its offset)."""
    if expected:  # only its first bytes (a docker layer's compression): the import verifies the rest
        src = MemberSource(reader)
        await src.begin()
        while len(src.head) < 16 and await src.read():
            pass
        return WriteResult(expected, 0, False), src.head
    if m.offset >= 0:
        digest, head = await hash_range(fd, m.name, m.offset, m.size)
        return WriteResult(digest, 0, False), head
    src = MemberSource(reader)
    await src.begin()
    h = hashlib.sha256()
    while chunk := await src.read():
        h.update(chunk)
    return WriteResult(f"sha256:{h.hexdigest()}", 0, False), src.head
