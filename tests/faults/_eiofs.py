"""A passthrough FUSE file system whose writes fail with EIO on demand: a disk going bad, without device-mapper.

Run as ``python -m tests.faults._eiofs BACKING MOUNTPOINT SWITCH`` (foreground; unmount to stop it). While
the file ``SWITCH`` (outside the mount) exists, every ``write``, ``fsync`` and ``create`` answers EIO, as a
failing disk does; reads and everything else pass through to ``BACKING``. Only the fault suite uses it:
the kernel's own error injection (``dm-flakey``, ``fail_make_request``) is not on every test machine, and
``/dev/fuse`` is.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

import mfusepy as fuse


class EioFs(fuse.Operations):  # type: ignore[misc]
    """Passthrough to ``backing``; writes fail while ``switch`` exists."""

    use_ns = True

    def __init__(self, backing: str, switch: str) -> None:
        self.backing = backing
        self.switch = switch

    def _p(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def _failing(self) -> None:
        if os.path.exists(self.switch):
            raise fuse.FuseOSError(errno.EIO)

    # metadata
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.lstat(self._p(path))
        keys = ("st_atime_ns", "st_ctime_ns", "st_gid", "st_mode", "st_mtime_ns", "st_nlink", "st_size", "st_uid")
        out: dict[str, Any] = {k.removesuffix("_ns"): getattr(st, k) for k in keys}
        return out

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._p(path))]

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._p(path), amode):
            raise fuse.FuseOSError(errno.EACCES)
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._p(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._p(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        if times is None:
            os.utime(self._p(path))
        else:
            os.utime(self._p(path), ns=times)
        return 0

    def statfs(self, path: str) -> dict[str, Any]:
        sv = os.statvfs(self._p(path))
        return {k: getattr(sv, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                                            "f_files", "f_flag", "f_frsize", "f_namemax")}

    # names
    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._p(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._p(path))
        return 0

    def unlink(self, path: str) -> int:
        os.unlink(self._p(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        os.rename(self._p(old), self._p(new))
        return 0

    def readlink(self, path: str) -> str:
        return os.readlink(self._p(path))

    # files
    def open(self, path: str, flags: int) -> int:
        return os.open(self._p(path), flags)

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        self._failing()
        return os.open(self._p(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._failing()
        return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._p(path), length)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self._failing()
        os.fsync(fh)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0


def main() -> None:
    backing, mountpoint, switch = sys.argv[1:4]
    fuse.FUSE(EioFs(backing, switch), mountpoint, foreground=True)


if __name__ == "__main__":
    main()
