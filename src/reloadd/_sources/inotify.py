"""The inotify source (asyncinotify): kernel events turned into :class:`SourceEvent` values.

What the peers get wrong and this gets right (see shared notes, watchers-and-reloaders):

- Each root's *parent* is watched too, so a root deleted and recreated is armed again;
  a root that does not exist yet is watched through its nearest existing ancestor, and
  a root that is a symlink is re-armed when it is retargeted.
- New sub-directories are armed (off the event loop) and re-examined at once, so files
  made before the watch existed are not missed.
- ``IN_Q_OVERFLOW``, an event with no path, and ``IGNORED``/``DELETE_SELF``/``MOVE_SELF``/
  ``UNMOUNT`` on a root or an ancestor mean "re-arm and rescan now", never silence.
- Every ``rescan_interval`` the watched anchors are checked against the inodes they were
  armed on, so a parent moved away without an event reaching us is noticed.
- Events are read by a thread of their own, as soon as the kernel has them, and handed to
  the loop in 256 KiB gulps: a loop busy settling a burst no longer lets the kernel's queue
  (``fs.inotify.max_queued_events``) overflow behind it. They are parsed here, straight into
  path strings and plain ints (asyncinotify's reader builds a ``Path``, an ``IntFlag`` and a weak reference per
  event, too slow to drain a 100,000-file burst before the kernel queue overflows);
  asyncinotify still arms and removes the watches.
- ``ENOSPC`` (watch limit) keeps the watches already armed, reports rescan-only mode once
  naming the sysctl, and retries the missing ones at the next check instead of spinning;
  ``EMFILE`` (instance limit) becomes :class:`WatchLimitError`.

Three modules: this one is the loop side (reads parsed into events, each event acted on), the reader thread is
:mod:`reloadd._sources._inotify_reader`, and the watches (arming, re-arming, recovery from lost events) are
:mod:`reloadd._sources._inotify_watches`, the source's base.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import sys
import time
from pathlib import Path

from asyncinotify import Inotify, Mask, Watch

from .._errors import WatchError
from .._filters import is_kubelet_internal, under
from .._source import EventKind, SourceContext, SourceEvent, file_event
from ._inotify_reader import HEADER as _HEADER
from ._inotify_reader import OVERFLOW as _OVERFLOW
from ._inotify_reader import OVERFLOW_EVENT as _OVERFLOW_EVENT
from ._inotify_reader import Reader
from ._inotify_watches import Watches, limit_error

__all__ = ["InotifySource"]

_FS_CODEC = (sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())
_ROOM_POLL = 0.05  # seconds between looks for lost events among the reads, while they are held back
# Plain ints for the per-event hot path: IntFlag membership tests cost ~15x more.
_IGNORED = int(Mask.IGNORED)
_SELF = int(Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.UNMOUNT)
_ISDIR = int(Mask.ISDIR)
_STRUCTURAL = int(Mask.CREATE | Mask.MOVED_TO | Mask.DELETE | Mask.MOVED_FROM)
_DONE = int(Mask.CLOSE_WRITE | Mask.MOVED_TO)
_ARRIVED = int(Mask.MOVED_TO)
_GONE = int(Mask.DELETE | Mask.MOVED_FROM)
_MODIFY = int(Mask.MODIFY)
_CREATE = int(Mask.CREATE)
_SPECIAL = _OVERFLOW | _IGNORED | _SELF | _ISDIR
_NOT_PLAIN = _SPECIAL | _STRUCTURAL  # an event that may not reuse the previous one's path and checks


class InotifySource(Watches):
    """Watch every root (recursively where asked) and report what the kernel says."""

    name = "inotify"

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx
        self.log = ctx.logger
        self._ino: Inotify | None = None
        self._by_path: dict[Path, tuple[Watch, int]] = {}  # path -> (watch, inode armed on)
        self._by_wd: dict[int, tuple[Watch, str]] = {}  # wd -> (watch, its path + "/") until IGNORED
        self._removed: set[int] = set()
        self._waiting: dict[Path, Path] = {}  # missing root -> ancestor watched for it
        self._limited: str | None = None
        self._limit_logged = False
        self._roots = {r.path: r for r in ctx.roots}
        self._root_strs = {str(r.path): r for r in ctx.roots}
        self._overflows = 0
        self._overflow_logged = -float("inf")
        self._recovery: asyncio.Task[None] | None = None
        self._recover_again = False

    @property
    def watch_count(self) -> int:
        """Watches currently held."""
        return len(self._by_path)

    async def run(self) -> None:
        """Arm every root and translate events until cancelled."""
        try:
            ino = Inotify()
        except OSError as exc:
            raise limit_error(exc, Path("/")) from exc
        self._ino = ino
        checker: asyncio.Task[None] | None = None
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        os.set_blocking(ino.fd, False)
        reader = Reader(ino.fd, loop, readable.set)
        try:
            await self._arm_all()
            checker = asyncio.create_task(self._check_loop(), name="reloadd-inotify-check")
            reader.start()
            while True:
                await readable.wait()
                readable.clear()
                while (data := reader.take()) is not None:
                    await self._room(reader, data)
                    await self._handle_buffer(data)
                    await asyncio.sleep(0)  # one read at a time: the engine's pump gets a turn in between
                if reader.dropped:
                    reader.dropped = False  # the loop fell too far behind: as if the kernel queue overflowed
                    await self._handle(-1, None, _OVERFLOW, "")
                if reader.error is not None:
                    failed = reader.error
                    raise WatchError(f"Failed to read inotify events: {failed.strerror or failed}") from failed
                done = self._recovery
                if done is not None and done.done():
                    self._recovery = None
                    done.result()  # a re-arm that failed (e.g. the instance limit) fails the source
        finally:
            await asyncio.to_thread(reader.stop)
            if self._recovery is not None:
                self._recovery.cancel()
                with contextlib.suppress(asyncio.CancelledError, WatchError):
                    await self._recovery
                self._recovery = None
            if checker is not None:
                checker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await checker
            self._ino = None
            self.ctx.coverage.clear()
            self._by_path.clear()
            self._by_wd.clear()
            self._removed.clear()
            self._waiting.clear()
            ino.close()

    # Events ----------------------------------------------------------------------
    async def _room(self, reader: Reader, data: bytes) -> None:
        """Hold the reads back while the engine has no room for more events (``Engine.room``).

        Not when events were lost (an overflow in ``data`` or in a read still queued, or reads dropped):
        everything up to the loss is parsed at once, in order, and its rescan starts right after.
        """
        room = self.ctx.room
        if room is None or _OVERFLOW_EVENT in data:
            return
        while not (reader.marked or reader.dropped):
            if await room(_ROOM_POLL):
                return

    async def _handle_buffer(self, data: bytes) -> None:
        """Parse one read of ``struct inotify_event`` records and act on them, in order.

        Plain file events are folded per path until the next event of another sort (or
        the end of the read): a file written in one go is CREATE, MODIFY, CLOSE_WRITE,
        which the engine would fold into the same one settle anyway, so it gets one
        event here, as the last of them says (and no stat for the CREATE).
        """
        unpack, size, end, off = _HEADER.unpack_from, _HEADER.size, len(data), 0
        run: dict[str, object] = {}
        folded: dict[str, int] = {}
        last_wd, last_raw, path = -1, b"", ""  # the previous event, when it was a plain file event (its path)
        while off + size <= end:
            wd, mask, _cookie, length = unpack(data, off)
            off += size
            raw = data[off:off + length]
            off += length
            if wd == last_wd and raw == last_raw and not mask & _NOT_PLAIN:
                # The same file as the event before (a write is CREATE, MODIFY, CLOSE_WRITE in a row): its path,
                # checks and place in the run are those of that event; no second decoding of the name.
                folded[path] = folded.get(path, 0) + 1
                run[path] = _kind_of(mask, run[path])
                continue
            last_wd = -1
            name = raw.rstrip(b"\0").decode(*_FS_CODEC) if length else ""  # os.fsdecode, minus its call cost
            held = self._by_wd.get(wd)
            if mask & _IGNORED and held is not None:
                del self._by_wd[wd]  # the kernel forgot the wd: it may be handed out again
                self._forget(wd)
            if mask & _SPECIAL or held is None or not name:
                self._emit_run(run, folded)
                await self._handle(wd, held[0] if held is not None else None, mask, name)
                continue
            # The hot path: an event about a file in a watched directory.
            path = held[1] + name
            if name.startswith(".."):
                if name.startswith("..data"):
                    self._emit_run(run, folded)
                    self._emit(EventKind.SUBTREE, held[0].path)  # a ConfigMap swap changes every key
                continue
            if mask & _STRUCTURAL and (self._waiting or path in self._root_strs):
                self._emit_run(run, folded)
                await self._handle(wd, held[0], mask, name)
                continue
            before = run.get(path)
            if before is not None:
                folded[path] = folded.get(path, 0) + 1
            run[path] = _kind_of(mask, before)
            last_wd, last_raw = wd, raw
        self._emit_run(run, folded)

    def _emit_run(self, run: dict[str, object], folded: dict[str, int] | None = None) -> None:
        """Emit the folded file events of ``run`` (in the order their paths first came) and empty both."""
        name = self.name
        out: list[SourceEvent] = []
        for path, kind in run.items():
            if isinstance(kind, _Created):
                kind = EventKind.WRITING if _fresh_file(path) else kind.before or EventKind.TOUCHED
            assert isinstance(kind, EventKind)
            out.append(file_event(kind, path, name, folded.get(path, 0) if folded else 0))
        self.ctx.emit_many(out)
        run.clear()
        if folded:
            folded.clear()

    def _forget(self, wd: int) -> None:
        """Drop asyncinotify's own reference to a watch the kernel removed (its reader would have)."""
        watches = getattr(self._ino, "_watches", None)
        if isinstance(watches, dict):
            watches.pop(wd, None)

    async def _handle(self, wd: int, watch: Watch | None, mask: int, name: str) -> None:
        """Everything but the plain file event: overflows, lost watches, directories, roots."""
        if mask & _OVERFLOW:
            self._overflows += 1
            now = time.monotonic()
            if now - self._overflow_logged >= 60.0:  # say so once a minute, not once per overflow
                self._overflow_logged = now
                self.log.warning(
                    "inotify queue overflowed %d time(s) (raise fs.inotify.max_queued_events); "
                    "re-arming and rescanning every root, nothing is lost", self._overflows,
                )
                self._overflows = 0
            self._recover()
            await asyncio.sleep(0)  # let the pump start the rescan before the rest of this read is parsed
            return
        if mask & _IGNORED:
            if watch is None or wd in self._removed:
                self._removed.discard(wd)
                return
            gone = watch.path  # the kernel dropped a watch: its directory went away
            held = self._by_path.get(gone)
            if held is not None and held[0] is watch:
                del self._by_path[gone]
                self.ctx.coverage.discard(str(gone))
            if any(under(r.path, gone) or r.path.parent == gone for r in self.ctx.roots):
                await self._rearm_roots_near(gone)
            return
        if watch is None:
            self._recover()  # an event we cannot place: look everywhere
            return
        path = watch.path / name if name else watch.path
        if mask & _SELF:
            if not name and any(under(r.path, path) for r in self.ctx.roots):
                await self._rearm_roots_near(path)
            return
        if is_kubelet_internal(name):
            if name.startswith("..data"):
                self._emit(EventKind.SUBTREE, watch.path)  # a ConfigMap swap changes every key
            return
        if mask & _ISDIR:
            await self._dir_event(path, mask)
            return
        if mask & _STRUCTURAL:
            if self._waiting:
                await self._maybe_waiting(path)
            root = self._root_for(path)
            if root is not None and (path.is_dir() or path in self._by_path):
                await self._rearm_roots_near(path)  # a root symlink retargeted, or replaced
                return
        self._emit_run({str(path): _kind_of(mask, None)})

    async def _maybe_waiting(self, path: Path) -> None:
        """A component of a root that did not exist appeared: arm that root again."""
        for root_path, anchor in list(self._waiting.items()):
            if path.parent == anchor and under(root_path, path):
                root = self._root_for(root_path)
                if root is not None:
                    await self._arm_root(root)
                    if root_path not in self._waiting:
                        self.log.warning("Root %s appeared; watching it", root_path)
                    self._emit(EventKind.SUBTREE, root_path)

    async def _dir_event(self, path: Path, mask: int) -> None:
        if mask & (Mask.CREATE | Mask.MOVED_TO):
            await self._maybe_waiting(path)
            root = self._root_for(path)
            if root is not None:
                self._remove_under(path)
                await self._arm_root(root)
            else:
                owners = [r for r in self.ctx.roots if under(path, r.path) and r.path != path]
                if not owners:
                    return
                if any(r.recursive for r in owners):
                    await self._arm_tree(path)
            self._emit(EventKind.SUBTREE, path)
        elif mask & (Mask.DELETE | Mask.MOVED_FROM):
            self._remove_under(path)
            if self._root_for(path) is not None:
                await self._rearm_roots_near(path)
            else:
                self._emit(EventKind.SUBTREE, path)


def _kind_of(mask: int, before: object) -> object:
    """What a file event makes of a path that had ``before`` (a kind or ``_Created``) in this run."""
    if mask & _ARRIVED:
        return _K_ARRIVED
    if mask & _DONE:
        return _K_WRITTEN
    if mask & _GONE:
        return _K_GONE
    if mask & _MODIFY:
        return _K_WRITING
    if mask & _CREATE:
        return _Created(before)  # a writer holds it if it is still empty: stat when the run is emitted
    return _K_TOUCHED if before is None else before


_K_ARRIVED, _K_WRITTEN, _K_GONE, _K_WRITING, _K_TOUCHED = (
    EventKind.ARRIVED, EventKind.WRITTEN, EventKind.GONE, EventKind.WRITING, EventKind.TOUCHED)
"""Read once: an enum member read through its class costs ~60 ns, and every file event of a burst asks one."""


class _Created:
    """A CREATE folded in a run: WRITING if the file is still empty, else what came ``before`` it."""

    __slots__ = ("before",)

    def __init__(self, before: object) -> None:
        self.before = before if isinstance(before, EventKind) else None


def _fresh_file(path: Path | str) -> bool:
    """A just-created empty regular file: its writer has it open (hold it until CLOSE_WRITE).

    Symlinks, hard links (``ln``), FIFOs and device nodes are created complete.
    """
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_size == 0


