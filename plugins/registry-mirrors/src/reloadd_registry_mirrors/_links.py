"""Opening a drop-in through its symlinks, checking every link on the way.

The kernel would follow links silently; :func:`open_drop_in` resolves the path itself, one component at a
time with ``O_PATH | O_NOFOLLOW``, so that the ownership of each symlink met (the drop-in, a link it points
to, or a *directory* link inside the path it points to) is checked on the inode that is then followed.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

__all__ = ["FOLLOW_INSIDE", "FOLLOW_ROOT_OWNED", "Refused", "open_drop_in"]

FOLLOW_INSIDE = "inside"
"""Symlinked drop-ins are read only when they resolve inside the drop-in folder (the default)."""
FOLLOW_ROOT_OWNED = "root-owned"
"""Also read drop-ins that resolve elsewhere when every link on the way and the file are root's (NixOS)."""
_MAX_HOPS = 40  # Linux's MAXSYMLINKS


class Refused(Exception):
    """A drop-in that must not be opened; the message says why."""


_DIR = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


def open_drop_in(path: Path, inside: Path, follow: str, flags: int, outside: list[Path]) -> int:
    """Open the drop-in ``path`` (a name in ``inside``) resolving its symlinks ourselves, one component at a time.

    Each component is opened with ``O_PATH | O_NOFOLLOW`` relative to the directory reached so far, so
    every symlink met, the drop-in itself and any directory link on the way alike, is checked on the very
    inode that is then followed (nothing can be swapped between check and use). A drop-in that ends up
    outside ``inside`` is refused under :data:`FOLLOW_INSIDE`; under :data:`FOLLOW_ROOT_OWNED` it is
    allowed only when every symlink met was owned by root, and its target is appended to ``outside``
    (the caller then requires the file itself to be root's).

    Raises:
        Refused: naming the offending link or target.
        OSError: from the lookups (``FileNotFoundError`` for a dangling link).
    """
    start = os.path.realpath(inside)
    dirfd = os.open(start, _DIR)
    where = Path(start)  # the physical path reached so far: no symlink left in it
    pending = [path.name]  # components still to resolve, next one last
    hops = 0
    not_root: Path | None = None  # the first symlink met that is not root's, and its owner
    link_owner = 0
    try:
        while True:
            name = pending.pop()
            if name in ("", "."):
                continue
            if name == "..":
                up = os.open("..", _DIR, dir_fd=dirfd)
                os.close(dirfd)
                dirfd, where = up, where.parent
                continue
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
            try:
                st = os.fstat(fd)
                if stat.S_ISLNK(st.st_mode):
                    hops += 1
                    if hops > _MAX_HOPS:
                        raise Refused(f"more than {_MAX_HOPS} symlinks on the way; refused")
                    if st.st_uid != 0 and not_root is None:
                        not_root = where / name
                        link_owner = st.st_uid
                    target = os.readlink("", dir_fd=fd)  # the link we just checked, not its name again
                    pending.extend(reversed(target.split("/")))
                    if target.startswith("/"):
                        os.close(dirfd)
                        dirfd, where = os.open("/", _DIR), Path("/")
                    continue
                if pending and any(c not in ("", ".") for c in pending):
                    if not stat.S_ISDIR(st.st_mode):
                        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(where / name))
                    os.close(dirfd)
                    dirfd, fd, where = fd, -1, where / name
                    continue
            finally:
                if fd >= 0:
                    os.close(fd)
            where = where / name
            if hops and not where.is_relative_to(start):
                _allow_outside(where, inside, follow, not_root, link_owner)
                outside.append(where)
            return _open_checked(name, dirfd, flags, where, st)
    finally:
        os.close(dirfd)


def _allow_outside(where: Path, inside: Path, follow: str, not_root: Path | None, link_owner: int) -> None:
    """Refuse a drop-in resolved to ``where``, outside ``inside``, unless ``follow`` allows it and every link
    on the way was root's (``not_root``: the first that was not, owned by ``link_owner``)."""
    if follow != FOLLOW_ROOT_OWNED:
        raise Refused(f"symlink points outside {inside} (to {where}); refused")
    if not_root is not None:
        raise Refused(f"symlink {not_root} (on the way to {where}) is owned by uid {link_owner}, not root; refused")


def _open_checked(name: str, dirfd: int, flags: int, where: Path, st: os.stat_result) -> int:
    """Open ``name`` in ``dirfd`` with ``flags``, only if it is still the inode ``st`` that was checked.

    Raises:
        Refused: it became a symlink or another file since (named by ``where``).
    """
    try:
        opened = os.open(name, flags | os.O_NOFOLLOW, dir_fd=dirfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the name became a symlink since it was checked
            raise Refused(f"{where} changed while it was being checked; refused") from exc
        raise
    now = os.fstat(opened)
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        os.close(opened)
        raise Refused(f"{where} changed while it was being checked; refused")
    return opened
