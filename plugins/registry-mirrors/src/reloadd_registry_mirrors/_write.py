"""Apply rendered files under ``hosts_dir``: atomic writes, owned-only removals.

Rules, each there because containerd reads these files on every pull:

* a file is written to a temp file in its own directory, fsynced, then renamed over
  ``hosts.toml`` (a half-written file fails to parse, and containerd then silently
  drops every mirror for that host);
* a text is parsed back with ``tomllib`` before it replaces anything: a file containerd
  cannot parse is never written, and the previous one for that host stays;
* a directory is ours only if its ``hosts.toml`` is a regular file whose first line is
  :data:`HEADER`; anything else (another tool's file, a symlink) is left alone;
* names are re-checked here so no path outside ``hosts_dir`` can ever be built.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from reloadd import StateError, atomic_write

from ._hosts import host_dir_name
from ._render import HEADER

__all__ = ["ApplyResult", "Step", "apply", "check_text", "decide", "is_owned", "read_hosts_file"]

HOSTS_FILE = "hosts.toml"


@dataclass(slots=True)
class ApplyResult:
    """What :func:`apply` did.

    Attributes:
        written: Directory names whose hosts.toml was (re)written.
        removed: Directory names whose owned hosts.toml was removed.
        unchanged: Directory names already up to date.
        skipped: Directory name → why it was left alone (not ours).
        invalid: Directory name → why its rendered text was refused (not valid TOML); the
            previous hosts.toml, if any, is kept.
    """

    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    invalid: dict[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        """Whether anything on disk changed."""
        return bool(self.written or self.removed)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_hosts_file(directory: Path) -> bytes | None:
    """Content of ``directory/hosts.toml`` if it is a regular file (symlinks not followed)."""
    try:
        fd = os.open(directory / HOSTS_FILE, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(1 << 20)
    finally:
        os.close(fd)


def is_owned(directory: Path) -> bool:
    """Whether ``directory`` is a real directory whose hosts.toml starts with reloadd's header."""
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return False
    except OSError:
        return False
    data = read_hosts_file(directory)
    return data is not None and data.split(b"\n", 1)[0] == HEADER.encode()


def check_text(text: str) -> str | None:
    """Why ``text`` must not become a hosts.toml (``"is not valid TOML: …"``), or ``None``.

    containerd drops a hosts.toml it cannot parse (and every mirror with it) without a word, so
    each generated text is parsed back with ``tomllib`` and must start with :data:`HEADER`
    (without it reloadd would never touch the file again).
    """
    try:
        text.encode("utf-8")
        tomllib.loads(text)
    except UnicodeEncodeError as exc:
        return f"is not encodable as UTF-8: {exc}"
    except tomllib.TOMLDecodeError as exc:
        return f"is not valid TOML: {exc}"
    except RecursionError:
        return "is not valid TOML: nested too deeply"
    if text.split("\n", 1)[0] != HEADER:
        return "does not start with the ownership header"
    return None


def _write_atomic(directory: Path, text: str) -> None:
    """The core's atomic write (every byte, fsync, rename, directory fsync, temp name never followed).

    Raises:
        OSError: it could not be written (the previous hosts.toml stays whole).
    """
    try:
        atomic_write(directory / HOSTS_FILE, text.encode(), mode=0o644)
    except StateError as exc:
        cause = exc.__cause__
        raise cause if isinstance(cause, OSError) else OSError(str(exc)) from exc


def _sweep(directory: Path) -> None:
    """Remove temp files a killed writer left behind (only our own names: ``.hosts.toml.tmp-<pid>``, and
    ``.hosts.toml.<pid>.tmp`` from earlier versions)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for n in names:
        if n.startswith(f".{HOSTS_FILE}.") and (n.endswith(".tmp") or n.startswith(f".{HOSTS_FILE}.tmp-")):
            with contextlib.suppress(OSError):
                os.unlink(directory / n)


@dataclass(frozen=True, slots=True)
class Step:
    """What :func:`apply` decides for one host directory, before touching anything.

    Attributes:
        name: The directory name (a host, or ``_default``).
        action: ``write``, ``remove``, ``unchanged``, ``skip`` (not ours) or ``invalid`` (text refused).
        why: For ``skip`` and ``invalid``, the reason.
        current: The hosts.toml there now, if it is a regular file.
        text: For ``write``, the new text.
        exists: Whether the directory exists (``write`` into a missing one creates it).
    """

    name: str
    action: str
    why: str = ""
    current: bytes | None = None
    text: str = ""
    exists: bool = True


def decide(root: Path, files: Mapping[str, str], keep: Collection[str] = (), reclaim: Collection[str] = ()
           ) -> list[Step]:
    """Decide, reading only, what making ``root`` hold exactly ``files`` takes (see :func:`apply`).

    Directories named in ``keep`` are not removed even when ``files`` leaves them out. Hosts named in
    ``reclaim`` are reloadd's although their hosts.toml lost its header (reloadd wrote it, and something
    rewrote it since: drift the guard saw), so they are written back.

    Raises:
        ValueError: a name that is not a valid host directory (never reached with rendered input).
    """
    steps: list[Step] = []
    for name, text in sorted(files.items()):
        directory = root / host_dir_name(name)
        if directory.parent != root:
            raise ValueError(f"refusing to write outside {root}: {name!r}")
        problem = check_text(text)
        if problem is not None:
            steps.append(Step(name, "invalid", f"generated {directory / HOSTS_FILE} {problem}"))
            continue
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            steps.append(Step(name, "write", text=text, exists=False))
            continue
        if not stat.S_ISDIR(st.st_mode):
            steps.append(Step(name, "skip", f"{directory} exists and is not a directory"))
            continue
        current = read_hosts_file(directory)
        if current is not None and current.split(b"\n", 1)[0] != HEADER.encode() and name not in reclaim:
            steps.append(Step(name, "skip", f"{directory / HOSTS_FILE} was not written by reloadd; left alone"))
        elif current is None and (directory / HOSTS_FILE).is_symlink():
            steps.append(Step(name, "skip", f"{directory / HOSTS_FILE} is a symlink; left alone"))
        else:
            steps.append(Step(name, "unchanged" if current == text.encode() else "write", current=current, text=text))
    try:
        entries = sorted(os.listdir(root))
    except FileNotFoundError:
        entries = []
    for entry in entries:
        if entry not in files and entry not in keep and is_owned(root / entry):
            steps.append(Step(entry, "remove", current=read_hosts_file(root / entry)))
    return steps


def apply(hosts_dir: Path, files: Mapping[str, str], keep: Collection[str] = (),
          reclaim: Collection[str] = ()) -> ApplyResult:
    """Make ``hosts_dir`` hold exactly ``files`` among the directories reloadd owns.

    Args:
        hosts_dir: containerd's ``config_path`` root (created if missing).
        files: Directory name → hosts.toml text, from :func:`render`. A text that fails
            :func:`check_text` is not written (listed in ``invalid``) and the directory's
            previous hosts.toml is neither replaced nor removed.
        keep: Directories to leave in place although ``files`` does not name them (their
            input is gone while prune safety holds its removal).
        reclaim: Hosts whose hosts.toml reloadd wrote and something else rewrote since: written back
            although the header that marks reloadd's files is gone.

    Raises:
        ValueError: a name that is not a valid host directory (never reached with rendered input).
        OSError: the directory cannot be written; nothing already written is rolled back,
            but every file on disk is always complete.
    """
    result = ApplyResult()
    hosts_dir.mkdir(parents=True, exist_ok=True)
    root = hosts_dir.resolve()
    for step in decide(root, files, keep, reclaim):
        directory = root / step.name
        if step.action == "invalid":
            result.invalid[step.name] = step.why
        elif step.action == "skip":
            result.skipped[step.name] = step.why
        elif step.action == "remove":
            _sweep(directory)
            (directory / HOSTS_FILE).unlink()
            try:
                directory.rmdir()
            except OSError:
                pass  # other files (certificates) live there too: keep the directory
            result.removed.append(step.name)
        else:
            if step.exists:
                _sweep(directory)
            else:
                directory.mkdir(mode=0o755)
                _fsync_dir(root)
            if step.action == "unchanged":
                result.unchanged.append(step.name)
                continue
            _write_atomic(directory, step.text)
            result.written.append(step.name)
    if result.removed:
        _fsync_dir(root)
    return result
