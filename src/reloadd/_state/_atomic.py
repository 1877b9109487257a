"""Atomic, durable file writes and the state directory's lock: the file-system side of the state.

``atomic_write`` is how every state file (records snapshots, ``prune.json``, a plugin's own files through
``reloadd.atomic_write``) is replaced: a crash leaves the old file or the new one, whole. ``lock_state_dir``
keeps two daemons from sharing (and corrupting) one state directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable
from pathlib import Path

from .._errors import StateError

__all__ = ["atomic_write", "lock_state_dir", "write_all"]


def atomic_write(path: Path, data: bytes | Iterable[bytes], mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` (bytes, or chunks of them) atomically and durably.

    Every byte is written (a short ``write`` is continued), the temp file is fsynced, renamed
    over ``path`` and the directory fsynced: a crash leaves the old file or the new one, whole.

    Raises:
        StateError: naming the file and the cause (e.g. the disk is full); the previous
            file is left intact.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        # O_NOFOLLOW: a symlink planted at the temp name is refused, never written through.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
        try:
            for chunk in (data,) if isinstance(data, bytes) else data:
                write_all(fd, chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise StateError(f"Failed to write {path}: {exc.strerror or exc}", path=str(path),
                         cause=exc.strerror or str(exc)) from exc


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd``, continuing a short ``write``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

def lock_state_dir(state_dir: Path) -> int:
    """Take an exclusive lock on ``state_dir`` so two daemons never share (and corrupt) its state."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Read-only: flock needs no write access, and a descriptor open for writing would keep the state's
        # file system from being remounted read-only (errors=remount-ro, an operator's `mount -o remount,ro`).
        fd = os.open(state_dir / "lock", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StateError(f"Failed to open state directory {state_dir}: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise StateError(
            f"state_dir {state_dir} is in use by another reloadd (its lock is held); "
            "give each daemon its own state_dir"
        ) from exc
    return fd
