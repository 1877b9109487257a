"""Stat walks and probes: with the digests (:mod:`reloadd._pipeline._digests`), the only filesystem reads the
engine makes itself.

Everything here is blocking and meant to run in a worker thread.
"""

from __future__ import annotations

import itertools
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, TypeAlias

from .._filters import under
from .._state._packed import pack_stat, unpack_stat
from .._types import Fingerprint
from ._digests import READ_FLAGS, sha256_of

__all__ = ["Found", "Listing", "Probe", "Trust", "local_devices", "present", "probe", "probe_read",
           "scan", "walk"]

SCAN_CHUNK = 4096
"""Entries a :func:`scan` with a sink holds at most before handing them over."""
_NOT_REGULAR = "not a regular file (FIFO, socket or device); ignored"

Found: TypeAlias = dict[str, bytes]
"""What a :func:`scan` stat-ed: path -> fingerprint packed (:func:`reloadd._state._packed.pack_stat`: 80 bytes of memory
a path against ~200 for a tuple and its integers; compared in place with the records,
:class:`reloadd._pipeline._inorder.InOrder`)."""

# File systems on which a live inotify watch on a directory sees every change made on this
# machine through it. Not network or FUSE file systems (changes made elsewhere are never
# reported) and not overlayfs (changes to its layers underneath are not).
LOCAL_FS_TYPES = frozenset({
    "ext2", "ext3", "ext4", "xfs", "btrfs", "bcachefs", "f2fs", "zfs", "jfs", "reiserfs", "nilfs2",
    "tmpfs", "ramfs", "vfat", "exfat", "ntfs3", "hfsplus",
})


def local_devices(mountinfo: str | None = None) -> frozenset[int]:
    """The ``st_dev`` of every mount whose type is in :data:`LOCAL_FS_TYPES`.

    ``mountinfo`` is the text of ``/proc/self/mountinfo`` (read when ``None``; unreadable:
    no device, so nothing is trusted). Blocking.
    """
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
                mountinfo = f.read()
        except OSError:
            return frozenset()
    devices: set[int] = set()
    for line in mountinfo.splitlines():
        fields = line.split()
        try:  # "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw"
            fstype = fields[fields.index("-", 6) + 1]
            major, minor = fields[2].split(":")
            dev = os.makedev(int(major), int(minor))
        except (ValueError, IndexError):
            continue
        if fstype in LOCAL_FS_TYPES:
            devices.add(dev)
    return frozenset(devices)


Listing: TypeAlias = tuple[tuple[int, int, int, int], tuple[str, ...]]
"""A covered directory as a walk listed it: its ``(st_dev, st_ino, st_mtime_ns, st_ctime_ns)`` then, and its
names that are not regular files (sub-directories, symlinks, the rest: stat-ed on every walk)."""

_SETTLED_NS = 1_000_000_000
"""A directory whose modification time is this recent when it is listed may have a name changed again within
the same timestamp (it comes from the kernel's coarse clock): its listing is not kept."""


@dataclass(frozen=True, slots=True)
class Trust:
    """What a periodic rescan may take on trust.

    Attributes:
        dirs: Directories a live watch has covered since before the previous rescan stat-ed them whole.
        devices: ``st_dev`` of the local file systems (:func:`local_devices`).
        shares: The covered directories have their files stat-ed over this many rescans, in turn...
        share: ...and this rescan stats those of the directories whose inode modulo ``shares`` is this.
        listings: The caller's memo of covered directories as a walk listed them (kept across walks):
            one whose times are those of its listing has the same names, so it is not listed again
            unless it is its turn; only its names that are not regular files are stat-ed.
        skipped: Filled by the walk: the directories it did not list.
    """

    dirs: frozenset[str]
    devices: frozenset[int]
    shares: int = 1
    share: int = 0
    listings: dict[str, Listing] | None = None
    skipped: set[str] = field(default_factory=set)
    listed: set[str] = field(default_factory=set)  # listed by this walk: never skipped later in it

    def covers(self, directory: str, st: os.stat_result) -> bool:
        """Whether the regular files of ``directory`` (``st`` its stat) may be taken on trust."""
        return directory in self.dirs and st.st_dev in self.devices

    def due(self, st: os.stat_result) -> bool:
        """Whether it is the turn of the directory (``st`` its stat) to have every file stat-ed."""
        return st.st_ino % self.shares == self.share

    def unchanged(self, directory: str, st: os.stat_result) -> tuple[str, ...] | None:
        """The names to stat of a covered ``directory`` that need not be listed; ``None``: list it."""
        memo = self.listings.get(directory) if self.listings is not None else None
        if memo is None or directory in self.listed:
            return None
        if directory in self.skipped or (memo[0] == _stamp(st) and not self.due(st)):
            self.skipped.add(directory)
            return memo[1]
        return None

    def remember(self, directory: str, st: os.stat_result, others: list[str] | None) -> None:
        """Keep ``directory``'s listing (``others`` its names that are not regular files; ``None``: forget it)."""
        self.listed.add(directory)
        if self.listings is None:
            return
        if others is None or time.time_ns() - st.st_mtime_ns < _SETTLED_NS:  # a name change sets both times
            self.listings.pop(directory, None)
        else:
            self.listings[directory] = (_stamp(st), tuple(others))


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


class Probe(NamedTuple):
    """What a stat of a candidate path found (a named tuple: one is built per settled path).

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


def probe(path: Path | str, root: Path | str) -> Probe:
    """Stat ``path``, following symlinks only while they stay under ``root``.

    A ConfigMap's ``key -> ..data/key`` symlinks stay inside the mount and are
    followed (so a ``..data`` swap changes the fingerprint); a symlink out of the
    tree is refused with an error naming where it points.
    """
    try:
        lst = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return _ABSENT
    except OSError as exc:
        return Probe(None, f"cannot stat: {exc.strerror or exc}")
    return _probe_from(lst, path, root)


def probe_read(path: str, root: Path | str, limit: int) -> tuple[Probe, str | None]:
    """:func:`probe` ``path`` and, when it is a regular file of at most ``limit`` bytes, read it at once for its
    SHA-256: one call where a probe and :meth:`DigestCache.digest` stat the path twice (~1.9 µs a small file,
    of ~10). The digest is ``None`` when the file was not read (not a regular file, a symlink, bigger, gone or
    unreadable, or changed while read): the hand-over then reads it as usual, and says why if it cannot.

    Nothing but a regular file is opened (the ``lstat`` comes first, and the open does not follow a symlink
    swapped in since).
    """
    try:
        lst = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return _ABSENT, None
    except OSError as exc:
        return Probe(None, f"cannot stat: {exc.strerror or exc}"), None
    if not stat.S_ISREG(lst.st_mode):
        return _probe_from(lst, path, root), None
    fp = Fingerprint.from_stat(lst)
    pr = _probe_of(Probe, (fp, None))
    size = lst.st_size
    if size > limit:
        return pr, None
    try:
        fd = os.open(path, READ_FLAGS | os.O_NOFOLLOW)
    except OSError:
        return pr, None
    try:
        return pr, sha256_of(fd, fp)
    except OSError:
        return pr, None
    finally:
        os.close(fd)


def _probe_from(lst: os.stat_result, path: Path | str, root: Path | str) -> Probe:
    """:func:`probe`'s verdict on ``path`` once ``lstat``-ed (``lst``)."""
    st = lst
    if stat.S_ISLNK(lst.st_mode):
        try:
            target = Path(os.path.realpath(path, strict=True))
        except FileNotFoundError:
            return _ABSENT  # dangling: as good as absent
        except OSError as exc:
            return Probe(None, f"cannot resolve symlink: {exc.strerror or exc}")
        if os.fspath(path) != os.fspath(root):  # a configured file root may point anywhere; entries below may not
            real_root = Path(os.path.realpath(root))
            if not under(target, real_root):
                return Probe(None, f"symlink resolves to {target}, outside the watched root {root}")
        try:
            st = os.stat(path)
        except OSError as exc:
            return Probe(None, f"cannot stat symlink target: {exc.strerror or exc}")
    if stat.S_ISDIR(st.st_mode):
        return _ABSENT
    if not stat.S_ISREG(st.st_mode):
        return Probe(None, _NOT_REGULAR)
    return _probe_of(Probe, (Fingerprint.from_stat(st), None))


# Probe(...) in C: no Python-level __new__ of a named tuple on the settle path (Fingerprint.from_stat does the same).
_probe_of: Callable[[type[Probe], tuple[Fingerprint, None]], Probe] = tuple.__new__
_ABSENT = Probe(None)
"""What a probe of a path that is not there (or a directory) finds: one shared, immutable answer (a burst of
100,000 removals probes 100,000 absent paths)."""


def walk(top: Path, root: Path, *, recursive: bool = True) -> Iterator[tuple[Path, Probe]]:
    """Yield ``(path, probe)`` for every candidate file under ``top`` (or ``top`` itself).

    ``root`` is the configured root ``top`` lies in (symlinks must stay inside it).
    Directories are not followed through symlinks (no loops, no escapes) and
    kubelet's ``..`` bookkeeping directories are skipped. An object per entry: the
    engine's rescans use :func:`scan` itself.
    """
    found: Found = {}
    errors: dict[str, str] = {}
    scan(os.fspath(top), os.fspath(root), recursive, found, errors)
    for path, fp in found.items():
        yield Path(path), Probe(Fingerprint(*unpack_stat(fp)))
    for path, error in errors.items():
        yield Path(path), Probe(None, error)


class WalkStopped(Exception):
    """A :func:`scan` was stopped (its ``stop`` was set) before its end.

    Attributes:
        left: The directories it had still to walk, the one it was in first (a walk resumed from
            ``left + done`` walks them first, then walks the others again).
        done: The directories it walked to their end.
    """

    def __init__(self, left: list[str] | None = None, done: list[str] | None = None) -> None:
        super().__init__("walk stopped")
        self.left = left or []
        self.done = done or []


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _stat_top(top: str, root: str) -> os.stat_result:
    """The stat of a walk's ``top``: a root may be a symlink to its directory, a directory below it may not."""
    return os.stat(top) if top == root else os.lstat(top)


def _open_dir(d: str, top: str, root: str) -> int:
    """Open directory ``d`` of a walk of ``top``: below the top, never through a symlink swapped in since it was
    listed (only a root is followed)."""
    return os.open(d, _DIR_FLAGS if d == top and top == root else _DIR_FLAGS | os.O_NOFOLLOW)


def scan(
    top: str,
    root: str,
    recursive: bool,
    found: Found,
    errors: dict[str, str],
    sink: Callable[[Found, set[str]], None] | None = None,
    trust: Trust | None = None,
    listed: set[str] | None = None,
    stop: threading.Event | None = None,
    start: list[str] | None = None,
) -> None:
    """:func:`walk` for the periodic rescan: fill ``found`` (path -> fingerprint tuple) and ``errors``.

    The same rules as :func:`walk` at close to ``find``'s cost: each directory is
    opened once, its names read in chunks and each ``lstat``-ed relative to the directory's
    descriptor (no path resolution per file, no ``DirEntry`` per file), and nothing
    is kept per entry but its path string and fingerprint tuple (equal to a
    :class:`Fingerprint`). Blocking.

    With ``trust`` (and ``listed``), the regular files of a directory it covers are not
    stat-ed unless it is the directory's turn (:meth:`Trust.due`): their paths go into
    ``listed`` (the directory entry's type says what they are, no stat). Symlinks,
    sub-directories and everything else are stat-ed as always. A covered directory whose
    times are those of its kept listing (:attr:`Trust.listings`) and whose turn it is not
    is not listed at all: its names are the listed ones, so only those that are no
    regular file are stat-ed, and it goes into :attr:`Trust.skipped`.

    With ``sink``, ``found`` and ``listed`` are handed to it and emptied whenever they hold
    :data:`SCAN_CHUNK` entries or more, so a walk of 100k files never holds them all
    (the caller hands over what is left at the end).

    With ``stop``, :class:`WalkStopped` is raised at the next directory or chunk of names once it is set;
    it says which directories were walked and which were not. With ``start`` (a stopped walk's
    ``left + done``), the walk takes those directories from the end of the list, each once, instead of
    beginning at ``top``: it goes on where the stopped one was, then walks again what that one had walked.
    """
    try:
        st = _stat_top(top, root)
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode):
        _probe_into(top, root, found, errors)
        return
    stack = [top] if start is None else list(start)
    done: dict[str, None] = {}  # walked, in order; each directory once (a resumed walk meets some again)
    while stack:
        if stop is not None and stop.is_set():
            raise WalkStopped(stack, list(done))
        d = stack.pop()
        if d in done:
            continue
        done[d] = None
        try:
            fd = _open_dir(d, top, root)
        except OSError:
            continue
        try:
            _scan_dir(d, fd, root, recursive, found, errors, stack, done, sink, trust, listed, stop)
        finally:
            os.close(fd)


def _scan_dir(
    d: str,
    fd: int,
    root: str,
    recursive: bool,
    found: Found,
    errors: dict[str, str],
    stack: list[str],
    done: dict[str, None],
    sink: Callable[[Found, set[str]], None] | None,
    trust: Trust | None,
    listed: set[str] | None,
    stop: threading.Event | None,
) -> None:
    """One directory of a :func:`scan` (open as ``fd``): its names stat-ed in chunks, or those of its kept listing
    when :class:`Trust` covers it; its sub-directories pushed on ``stack``. An error reading it ends it quietly."""
    others: list[str] | None = None  # a covered directory's names that are not regular files
    try:
        prefix = d if d.endswith("/") else d + "/"
        trusted = False
        if listed is not None and trust is not None:
            dst = os.fstat(fd)  # before the listing: a change while it runs moves the times past this
            if trust.covers(d, dst):
                names_ = trust.unchanged(d, dst)
                if names_ is not None:  # the same names as when listed: only those that are no regular file
                    _scan_names(list(names_), prefix, fd, root, recursive, found, errors, stack)
                    return
                trusted, others = not trust.due(dst), []
        with os.scandir(fd) as entries:  # names streamed: a 100k-file directory is never listed whole
            while chunk := list(itertools.islice(entries, SCAN_CHUNK)):
                if others is not None:
                    assert listed is not None
                    names = _list_covered(chunk, prefix, listed if trusted else None, others)
                else:
                    names = [e.name for e in chunk]
                _scan_names(names, prefix, fd, root, recursive, found, errors, stack)
                if stop is not None and stop.is_set():
                    raise WalkStopped([*stack, d], list(done)[:-1])  # this one from its start again, first
                if sink is not None and len(found) + (len(listed) if listed else 0) >= SCAN_CHUNK:
                    sink(found, listed if listed is not None else set())
                    found.clear()
                    if listed is not None:
                        listed.clear()
        if others is not None:
            assert trust is not None
            trust.remember(d, dst, others)
    except OSError:
        if others is not None:
            assert trust is not None
            trust.remember(d, dst, None)

def present(top: str, root: str, recursive: bool) -> set[str]:
    """The paths a :func:`scan` of ``top`` would find (regular files, and symlinks to regular files inside
    ``root``), told by the type each directory entry gives: no regular file is stat-ed. For a walk's deletion
    pass, which only asks which recorded paths are still there (a rescan of 100,000 files that found 1,000 gone:
    750-778 ms of CPU with a second stat walk, 462-487 with this). Symlinks are resolved as a scan resolves
    them; an entry of unknown type is stat-ed (``DirEntry`` does it). Blocking.
    """
    out: set[str] = set()
    found: Found = {}
    try:
        st = _stat_top(top, root)
    except OSError:
        return out
    if not stat.S_ISDIR(st.st_mode):
        _probe_into(top, root, found, {})
        return set(found)
    stack = [top]
    while stack:
        d = stack.pop()
        try:
            fd = _open_dir(d, top, root)
        except OSError:
            continue
        try:
            prefix = d if d.endswith("/") else d + "/"
            with os.scandir(fd) as entries:
                for e in entries:
                    name = e.name
                    if name.startswith(".."):
                        continue  # kubelet's bookkeeping, as in a scan
                    if e.is_file(follow_symlinks=False):
                        out.add(prefix + name)
                    elif e.is_dir(follow_symlinks=False):
                        if recursive:
                            stack.append(prefix + name)
                    elif e.is_symlink():
                        _probe_into(prefix + name, root, found, {})
        except OSError:
            continue
        finally:
            os.close(fd)
    out.update(found)
    return out


def _list_covered(chunk: list[os.DirEntry[str]], prefix: str, listed: set[str] | None, others: list[str]) -> list[str]:
    """Sort a covered directory's entries: the names that are not regular files go into ``others``; with
    ``listed``, the regular files' paths go there (met without a stat). Return the names to stat."""
    names: list[str] = []
    for e in chunk:  # the entry's type comes from the directory listing: no stat
        if e.is_file(follow_symlinks=False):
            if listed is None:
                names.append(e.name)
            elif not e.name.startswith(".."):
                listed.add(prefix + e.name)
        else:
            others.append(e.name)
            names.append(e.name)
    return names


def _scan_names(
    names: list[str],
    prefix: str,
    fd: int,
    root: str,
    recursive: bool,
    found: Found,
    errors: dict[str, str],
    stack: list[str],
) -> None:
    lstat, is_reg, is_dir, is_lnk, pack = os.lstat, stat.S_ISREG, stat.S_ISDIR, stat.S_ISLNK, pack_stat
    for name in names:
        if name[0] == "." and name.startswith(".."):  # the first test alone: ~20 ns a name against ~45
            continue  # kubelet's bookkeeping, file or directory (is_kubelet_internal)
        try:
            est = lstat(name, dir_fd=fd)
        except OSError:
            continue
        mode = est.st_mode
        if is_reg(mode):
            found[prefix + name] = pack(est.st_ino, est.st_size, est.st_mtime_ns, est.st_ctime_ns)
        elif is_dir(mode):
            if recursive:
                stack.append(prefix + name)
        elif is_lnk(mode):
            _probe_into(prefix + name, root, found, errors)
        else:
            errors[prefix + name] = _NOT_REGULAR


def _probe_into(path: str, root: str, found: Found, errors: dict[str, str]) -> None:
    pr = probe(path, root)
    if pr.fingerprint is not None:
        found[path] = pack_stat(*pr.fingerprint)
    elif pr.error is not None:
        errors[path] = pr.error
