"""Real file systems that fail, for the state-disk faults: a small tmpfs (fills up), a remount read-only,
and a FUSE passthrough whose writes fail with EIO on demand (``_eiofs``). The tests run as root."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["eio_fs", "fill", "remount", "tmpfs"]


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``1m``) mounted on ``path`` for the block."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        _umount(path)


def remount(path: Path, mode: str) -> None:
    """``mount -o remount,ro`` (or ``rw``) the file system mounted on ``path``."""
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True)


def fill(path: Path) -> int:
    """Write ``path`` until its file system is full (ENOSPC); the bytes written."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (65536, 4096, 512, 1):
            data = b"\0" * chunk
            while True:
                try:
                    os.write(fd, data)
                    written += chunk
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return written


@contextlib.contextmanager
def eio_fs(backing: Path, mountpoint: Path, switch: Path) -> Iterator[Path]:
    """The EIO passthrough of ``backing`` on ``mountpoint``: writes fail while ``switch`` exists."""
    backing.mkdir(parents=True, exist_ok=True)
    mountpoint.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "tests.faults._eiofs", str(backing), str(mountpoint), str(switch)],
                            cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mountpoint):  # another process's mount: nothing of ours to await
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
            assert time.monotonic() < deadline, "the FUSE file system did not mount"
            time.sleep(0.05)
        yield mountpoint
    finally:
        _umount(mountpoint)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
