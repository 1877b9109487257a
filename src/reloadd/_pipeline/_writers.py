"""Which processes hold a file open for writing, as ``/proc`` tells (for status and warnings, never decisions)."""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["writers_of"]

_WRITE_MODES = (os.O_WRONLY, os.O_RDWR)


def writers_of(paths: Iterable[str], proc: str = "/proc") -> dict[str, list[int]]:
    """The pids that have each of ``paths`` open for writing (blocking: reads every process's fd table).

    Processes this one may not inspect (another user's, without privileges) are skipped, so
    the answer is what ``/proc`` tells, possibly nothing.
    """
    wanted = set(paths)
    out: dict[str, list[int]] = {}
    if not wanted:
        return out
    try:
        pids = [int(d) for d in os.listdir(proc) if d.isdigit()]
    except OSError:
        return out
    for pid in sorted(pids):
        fd_dir = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target not in wanted or not _writable(f"{proc}/{pid}/fdinfo/{fd}"):
                continue
            pids_of = out.setdefault(target, [])
            if pid not in pids_of:
                pids_of.append(pid)
    return out


def _writable(fdinfo: str) -> bool:
    try:
        with open(fdinfo, "rb") as fh:
            for line in fh:
                if line.startswith(b"flags:"):
                    return (int(line.split()[1], 8) & os.O_ACCMODE) in _WRITE_MODES
    except (OSError, ValueError, IndexError):
        return False
    return False
