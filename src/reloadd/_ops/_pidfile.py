"""Pid files: written atomically without following symlinks, validated before a signal.

A pid file lives in a directory other users may be able to write to (``/run`` is
root's, but a ``pid_file`` under ``/tmp`` or a shared volume is not), and whatever
reads it back sends a signal to the number it finds, often as root. So:

* :func:`write_pid_file` writes a temporary file in the same directory (``O_EXCL``,
  ``O_NOFOLLOW``), sets mode 0644, fsyncs it and renames it over the final path.
  ``rename(2)`` replaces a symlink planted at that path instead of writing through it,
  and a reader never sees a half-written number.
* :func:`remove_pid_file` removes the file on exit, but only while it still holds our
  pid (a newer daemon may have replaced it).
* :func:`read_pid_file` refuses a symlink, anything but a plain decimal number, pids
  0, 1 and negatives (``kill(-1, sig)`` as root signals every process), a process that
  is gone (a stale file after ``kill -9``), and a live process whose
  ``/proc/<pid>/cmdline`` does not look like the expected program (a recycled pid).
* :func:`signal_pid_file` holds a pidfd across the check and the signal, so the pid
  cannot be recycled in between.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import stat
from pathlib import Path

from .._errors import ReloaddError

__all__ = ["looks_like", "pid_problem", "read_pid_file", "remove_pid_file", "signal_pid_file", "write_pid_file"]

_MAX_SIZE = 64  # a pid is at most 7 digits; anything much longer is not a pid file
_PID_MAX_LIMIT = 4 * 1024 * 1024  # the kernel's PID_MAX_LIMIT on 64-bit: no pid is larger
_NUMBER = re.compile(rb"\s*(\d{1,10})\s*")
_PYTHON_MODULE_FLAG = "-m"


def write_pid_file(path: Path, pid: int | None = None) -> None:
    """Atomically write ``pid`` (default: this process) to ``path``, mode 0644.

    Raises:
        ReloaddError: naming the file and the cause (directory not writable, the path
            is a directory, ...).
    """
    pid = os.getpid() if pid is None else pid
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        import tempfile  # with shutil, 0.9 MiB of modules: only where a pid file is written

        # mkstemp opens with O_CREAT | O_EXCL | O_NOFOLLOW: never through a symlink.
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise ReloaddError(f"Failed to write pid file {path}: {exc.strerror or exc}") from exc
    try:
        try:
            os.fchmod(fd, 0o644)
            os.write(fd, f"{pid}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)  # replaces a symlink at ``path``; never follows it
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise ReloaddError(f"Failed to write pid file {path}: {exc.strerror or exc}") from exc
    with contextlib.suppress(OSError):  # durability of the rename; best effort
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def remove_pid_file(path: Path, pid: int | None = None) -> bool:
    """Remove ``path`` if it still holds ``pid`` (default: this process); return whether it did."""
    pid = os.getpid() if pid is None else pid
    try:
        held = _read_number(path)
    except ReloaddError:
        return False
    if held != pid:
        return False
    try:
        os.unlink(path)
    except OSError:
        return False
    return True


def read_pid_file(path: Path, expect: str | None = "reloadd") -> int:
    """Read and validate the pid in ``path``.

    Args:
        path: The pid file.
        expect: The program the process must be (matched against the basename of its
            ``argv[0]``; or, for a Python interpreter, of ``argv[1]`` or ``-m <expect>``);
            ``None`` skips that check.

    Returns:
        A pid greater than 1 of a live process that looks like ``expect``.

    Raises:
        ReloaddError: naming the file and why its pid is refused.
    """
    pid = _read_number(path)
    problem = pid_problem(pid, expect)
    if problem:
        raise ReloaddError(f"Refusing pid file {path}: {problem}")
    return pid


def signal_pid_file(path: Path, sig: int = signal.SIGHUP, expect: str | None = "reloadd") -> int:
    """Send ``sig`` to the process named by ``path`` after :func:`read_pid_file`'s checks.

    Returns:
        The pid signalled.

    Raises:
        ReloaddError: the file is refused (see :func:`read_pid_file`) or the signal
            cannot be sent (e.g. the process belongs to another user).
    """
    pid = _read_number(path)
    pidfd: int | None = None
    if 1 < pid <= _PID_MAX_LIMIT:
        with contextlib.suppress(OSError, AttributeError):  # pidfd: Linux >= 5.3
            pidfd = os.pidfd_open(pid)
    try:
        problem = pid_problem(pid, expect)
        if problem:
            raise ReloaddError(f"Refusing pid file {path}: {problem}")
        try:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError as exc:
            raise ReloaddError(f"Refusing pid file {path}: process {pid} exited (stale pid file)") from exc
        except OSError as exc:
            raise ReloaddError(
                f"Failed to signal pid {pid} from pid file {path}: {exc.strerror or exc}"
            ) from exc
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return pid


def pid_problem(pid: int, expect: str | None) -> str | None:
    """Why ``pid`` must not be signalled, or ``None`` when it may."""
    if pid <= 1:
        return f"pid {pid} is not a daemon's pid (0, 1 and negative pids signal groups or init)"
    if pid > _PID_MAX_LIMIT:
        return f"pid {pid} is beyond the kernel's limit ({_PID_MAX_LIMIT})"
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return f"no process {pid} is running (stale pid file)"
    except OSError as exc:
        return f"cannot inspect process {pid}: {exc.strerror or exc}"
    if not raw:
        return f"process {pid} has exited (a zombie, or a kernel thread)"
    if expect is not None and not looks_like(raw, expect):
        shown = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")[:120]
        return f"process {pid} is {shown!r}, not {expect} (the pid was reused?)"
    return None


def looks_like(cmdline: bytes, program: str) -> bool:
    """Whether a ``/proc/<pid>/cmdline`` runs ``program`` (directly, as a script, or ``-m``)."""
    argv = [a.decode(errors="replace") for a in cmdline.rstrip(b"\0").split(b"\0")]
    if os.path.basename(argv[0]) == program:
        return True  # /usr/bin/reloadd run
    if not os.path.basename(argv[0]).startswith("python"):
        return False
    if len(argv) > 1 and os.path.basename(argv[1]) == program:
        return True  # python3 /usr/local/bin/reloadd run (a console script run through its shebang)
    for flag, module in itertools.pairwise(argv):
        if flag == _PYTHON_MODULE_FLAG and module.split(".")[0] == program:
            return True  # python3 -m reloadd run
    return False


def _read_number(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            raise ReloaddError(f"Refusing pid file {path}: it is a symlink") from exc
        raise ReloaddError(f"Failed to read pid file {path}: {exc.strerror or exc}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ReloaddError(f"Refusing pid file {path}: not a regular file")
        data = os.read(fd, _MAX_SIZE + 1)
    except OSError as exc:
        raise ReloaddError(f"Failed to read pid file {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    m = _NUMBER.fullmatch(data)
    if m is None or len(data) > _MAX_SIZE:
        shown = data[:40].decode(errors="replace")
        raise ReloaddError(f"Refusing pid file {path}: expected a process id, got {shown!r}")
    return int(m.group(1))
