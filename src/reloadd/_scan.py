"""Stat walks and content digests: the only filesystem reads the engine makes itself.

Everything here is blocking and meant to run in a worker thread.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ._filters import is_kubelet_internal, under
from ._types import Fingerprint

__all__ = ["DigestCache", "Probe", "probe", "walk"]

_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Probe:
    """What a stat of a candidate path found.

    Attributes:
        fingerprint: Set when the path is a regular file (after following symlinks
            that stay inside the root).
        error: Why the path cannot be handed over although it exists (a FIFO, a
            symlink leaving the root, a loop); ``None`` otherwise.
    """

    fingerprint: Fingerprint | None
    error: str | None = None

    @property
    def exists(self) -> bool:
        """The path is a regular file that can be handed over."""
        return self.fingerprint is not None


def probe(path: Path, root: Path) -> Probe:
    """Stat ``path``, following symlinks only while they stay under ``root``.

    A ConfigMap's ``key -> ..data/key`` symlinks stay inside the mount and are
    followed (so a ``..data`` swap changes the fingerprint); a symlink out of the
    tree is refused with an error naming where it points.
    """
    try:
        lst = os.lstat(path)
    except FileNotFoundError:
        return Probe(None)
    except NotADirectoryError:
        return Probe(None)
    except OSError as exc:
        return Probe(None, f"cannot stat: {exc.strerror or exc}")
    st = lst
    if stat.S_ISLNK(lst.st_mode):
        try:
            target = Path(os.path.realpath(path, strict=True))
        except FileNotFoundError:
            return Probe(None)  # dangling: as good as absent
        except OSError as exc:
            return Probe(None, f"cannot resolve symlink: {exc.strerror or exc}")
        if path != root:  # a configured file root may point anywhere; entries below a root may not
            real_root = Path(os.path.realpath(root))
            if not under(target, real_root):
                return Probe(None, f"symlink resolves to {target}, outside the watched root {root}")
        try:
            st = os.stat(path)
        except OSError as exc:
            return Probe(None, f"cannot stat symlink target: {exc.strerror or exc}")
    if stat.S_ISDIR(st.st_mode):
        return Probe(None)
    if not stat.S_ISREG(st.st_mode):
        return Probe(None, "not a regular file (FIFO, socket or device); ignored")
    return Probe(Fingerprint.from_stat(st))


def walk(top: Path, root: Path, *, recursive: bool = True) -> Iterator[tuple[Path, Probe]]:
    """Yield ``(path, probe)`` for every candidate file under ``top`` (or ``top`` itself).

    ``root`` is the configured root ``top`` lies in (symlinks must stay inside it).
    Directories are not followed through symlinks (no loops, no escapes) and
    kubelet's ``..`` bookkeeping directories are skipped.
    """
    try:
        st = os.stat(top) if top == root else os.lstat(top)  # a root may be a symlink to its directory
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode):
        yield top, probe(top, root)
        return
    stack = [top]
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for entry in it:
                name = entry.name
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                if is_dir:
                    if recursive and not is_kubelet_internal(name) and not entry.is_symlink():
                        stack.append(Path(entry.path))
                    continue
                if is_kubelet_internal(name):
                    continue
                p = Path(entry.path)
                if entry.is_symlink():
                    pr = probe(p, root)
                    if pr.fingerprint is None and pr.error is None:
                        continue  # dangling, or a link to a directory
                    yield p, pr
                    continue
                try:
                    est = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(est.st_mode):
                    yield p, Probe(Fingerprint.from_stat(est))
                else:
                    yield p, Probe(None, "not a regular file (FIFO, socket or device); ignored")


class DigestCache:
    """SHA-256 of file contents, cached by fingerprint (bounded, oldest evicted)."""

    def __init__(self, max_entries: int = 4096) -> None:
        self._cache: dict[tuple[Path, Fingerprint], str] = {}
        self._max = max_entries

    def digest(self, path: Path, fp: Fingerprint) -> str | None:
        """The digest of ``path`` if it still has fingerprint ``fp``; ``None`` if it moved on.

        Raises:
            OSError: the file exists but cannot be read (permissions, I/O error).
        """
        key = (path, fp)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        h = hashlib.sha256()
        try:
            # O_NONBLOCK: never hang on a FIFO swapped in after the stat.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None  # gone since the stat
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or Fingerprint.from_stat(st) != fp:
                return None
            while True:
                chunk = os.read(fd, _CHUNK)
                if not chunk:
                    break
                h.update(chunk)
            if Fingerprint.from_stat(os.fstat(fd)) != fp:
                return None  # written to while we read
        finally:
            os.close(fd)
        value = h.hexdigest()
        if len(self._cache) >= self._max:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = value
        return value
