"""Content digests: the SHA-256 of a file's bytes, taken only while they are the content its fingerprint names.

The other half of :mod:`reloadd._pipeline._scan` (the stat walks): a digest is read from an open descriptor,
at most the probed size, then checked with one ``fstat`` against the fingerprint, so a file replaced or written
to meanwhile is never given a digest that is not its content's. :class:`DigestCache` keeps a burst's digests.
Blocking: meant for a worker thread.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from .._types import Fingerprint

__all__ = ["READ_FLAGS", "DigestCache", "sha256_of"]

_CHUNK = 1 << 20
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: never hang on a FIFO swapped in after the stat


def sha256_of(fd: int, fp: Fingerprint) -> str | None:
    """The SHA-256 of the open file ``fd`` if its bytes are the content ``fp`` was taken of; ``None`` if it moved on.

    No more than the probed size is read (a device swapped in is not read for ever), then one ``fstat``: the
    same inode, size and times as probed means these bytes are that content.

    Raises:
        OSError: the file is still the one probed but cannot be read (an I/O error).
    """
    left = fp[1]
    try:
        first = os.read(fd, left if left <= _CHUNK else _CHUNK) if left else b""
        h = hashlib.sha256(first)  # a small file: one read, hashed as the object is made
        left -= len(first)
        while left and first:
            chunk = os.read(fd, min(_CHUNK, left))
            if not chunk:
                break  # shorter than probed: the fstat says it moved on
            h.update(chunk)
            left -= len(chunk)
    except OSError:
        if not _still(fd, fp):
            return None  # a directory or FIFO swapped in
        raise
    if not _still(fd, fp):
        return None  # replaced, or written to before or while we read
    return h.hexdigest()


def _still(fd: int, fp: Fingerprint) -> bool:
    """Whether the open file ``fd`` is the regular file ``fp`` was taken of, as it was then."""
    st = os.fstat(fd)
    return (stat.S_ISREG(st.st_mode) and st.st_ino == fp[0] and st.st_size == fp[1] and st.st_mtime_ns == fp[2]
            and st.st_ctime_ns == fp[3])


class DigestCache:
    """SHA-256 of file contents, cached per path with the fingerprint it was read at (bounded: emptied when full).

    A burst reads each file once, so the cache must cost next to nothing: keyed by the path alone (its hash
    is kept by the string, where a (path, fingerprint) key hashed five objects per lookup) and emptied when
    full rather than evicting the oldest entry per insert (a scan past the deleted entries at the front of
    the table): 1.1-1.5 µs less a file, ~15 % of a small file's digest.
    """

    def __init__(self, max_entries: int = 1024) -> None:
        self._cache: dict[str, tuple[Fingerprint, str]] = {}
        self._max = max_entries

    def clear(self) -> None:
        """Forget every digest (a burst is over: nothing is likely to be asked again soon)."""
        self._cache = {}

    def digest(self, path: Path | str, fp: Fingerprint) -> str | None:
        """The digest of ``path`` if it still has fingerprint ``fp``; ``None`` if it moved on.

        Raises:
            OSError: the file exists but cannot be read (permissions, I/O error).
        """
        key = os.fspath(path)
        hit = self._cache.get(key)
        if hit is not None and hit[0] == fp:
            return hit[1]
        try:
            fd = os.open(key, READ_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            return None  # gone since the stat
        try:
            value = sha256_of(fd, fp)
        finally:
            os.close(fd)
        if value is None:
            return None
        if len(self._cache) >= self._max:
            self._cache = {}
        self._cache[key] = (fp, value)
        return value
