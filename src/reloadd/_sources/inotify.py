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
- The read batch is raised from asyncinotify's 10 events to 1024.
- ``ENOSPC`` (watch limit) keeps the watches already armed, reports rescan-only mode once
  naming the sysctl, and retries the missing ones at the next check instead of spinning;
  ``EMFILE`` (instance limit) becomes :class:`WatchLimitError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
import time
from pathlib import Path

from asyncinotify import Event, Inotify, Mask, Watch

from .._errors import WatchError, WatchLimitError
from .._filters import is_kubelet_internal, under
from .base import EventKind, SourceContext, SourceEvent, WatchRoot

__all__ = ["InotifySource"]

_MASK = (
    Mask.CREATE
    | Mask.DELETE
    | Mask.MODIFY
    | Mask.CLOSE_WRITE
    | Mask.MOVED_FROM
    | Mask.MOVED_TO
    | Mask.ATTRIB
    | Mask.DELETE_SELF
    | Mask.MOVE_SELF
    | Mask.ONLYDIR
    | Mask.EXCL_UNLINK
)
_READ_BATCH = 1024
# Plain ints for the per-event hot path: IntFlag membership tests cost ~15x more.
_OVERFLOW = int(Mask.Q_OVERFLOW)
_IGNORED = int(Mask.IGNORED)
_SELF = int(Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.UNMOUNT)
_ISDIR = int(Mask.ISDIR)
_STRUCTURAL = int(Mask.CREATE | Mask.MOVED_TO | Mask.DELETE | Mask.MOVED_FROM)
_DONE = int(Mask.CLOSE_WRITE | Mask.MOVED_TO)
_GONE = int(Mask.DELETE | Mask.MOVED_FROM)
_MODIFY = int(Mask.MODIFY)
_CREATE = int(Mask.CREATE)


def _limit_error(exc: OSError, path: Path) -> WatchError:
    if exc.errno == errno.ENOSPC:
        return WatchLimitError(
            f"Failed to watch {path}: the inotify watch limit is reached; raise the sysctl "
            "fs.inotify.max_user_watches (continuing with rescans only where unwatched)",
            "fs.inotify.max_user_watches",
        )
    if exc.errno == errno.EMFILE:
        return WatchLimitError(
            "Failed to create an inotify instance: the limit is reached; raise the sysctl "
            "fs.inotify.max_user_instances or the open-files limit (continuing with rescans only)",
            "fs.inotify.max_user_instances",
        )
    return WatchError(f"Failed to watch {path}: {exc.strerror or exc}")


def _list_dirs(top: Path) -> list[Path]:
    """``top`` and every directory below it (not through symlinks, not kubelet ``..`` dirs). Blocking."""
    out = [top]
    stack = [top]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False) and not is_kubelet_internal(entry.name):
                            p = Path(entry.path)
                            out.append(p)
                            stack.append(p)
                    except OSError:
                        continue
        except OSError:
            continue
    return out


class InotifySource:
    """Watch every root (recursively where asked) and report what the kernel says."""

    name = "inotify"

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx
        self.log = ctx.logger
        self._ino: Inotify | None = None
        self._by_path: dict[Path, tuple[Watch, int]] = {}  # path -> (watch, inode armed on)
        self._removed: set[int] = set()
        self._waiting: dict[Path, Path] = {}  # missing root -> ancestor watched for it
        self._limited: str | None = None
        self._limit_logged = False
        self._roots = {r.path: r for r in ctx.roots}
        self._overflows = 0
        self._overflow_logged = -float("inf")

    @property
    def watch_count(self) -> int:
        """Watches currently held."""
        return len(self._by_path)

    async def run(self) -> None:
        """Arm every root and translate events until cancelled."""
        try:
            ino = Inotify(cache_size=_READ_BATCH)
        except OSError as exc:
            raise _limit_error(exc, Path("/")) from exc
        self._ino = ino
        checker: asyncio.Task[None] | None = None
        try:
            await self._arm_all()
            checker = asyncio.create_task(self._check_loop(), name="reloadd-inotify-check")
            async for event in ino:
                await self._handle(event)
        finally:
            if checker is not None:
                checker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await checker
            self._ino = None
            self._by_path.clear()
            self._removed.clear()
            self._waiting.clear()
            ino.close()

    # Arming ----------------------------------------------------------------------
    async def _arm_all(self) -> None:
        for root in self.ctx.roots:
            await self._arm_root(root)
        self._report()

    def _report(self) -> None:
        self.ctx.degraded(self._limited)

    def _add(self, path: Path) -> bool:
        assert self._ino is not None
        try:
            ino = os.stat(path).st_ino
        except OSError:
            return False
        held = self._by_path.get(path)
        if held is not None:
            if held[1] == ino:
                return True
            self._remove_under(path)  # the path now names another directory: a stale watch
        try:
            watch = self._ino.add_watch(path, _MASK)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return False
            if exc.errno == errno.EACCES:
                self.log.warning("Failed to watch %s: permission denied (covered by rescans only)", path)
                return False
            err = _limit_error(exc, path)
            if isinstance(err, WatchLimitError) and err.sysctl == "fs.inotify.max_user_watches":
                if not self._limit_logged:
                    self.log.error("%s", err)
                    self._limit_logged = True
                self._limited = str(err)
                return False
            raise err from exc
        self._removed.discard(watch.wd)
        self._by_path[path] = (watch, ino)
        return True

    async def _arm_tree(self, top: Path) -> None:
        dirs = await asyncio.to_thread(_list_dirs, top)
        for d in dirs:
            if not self._add(d) and self._limited:
                return

    async def _arm_root(self, root: WatchRoot) -> None:
        path = root.path
        anchor = path.parent
        while not anchor.is_dir() and anchor != anchor.parent:
            anchor = anchor.parent
        self._add(anchor)
        if anchor != path.parent:
            if path not in self._waiting:
                self.log.warning("Root %s does not exist yet; waiting for it (watching %s)", path, anchor)
            self._waiting[path] = anchor
            return
        self._waiting.pop(path, None)
        if path.is_dir():  # follows a symlinked root to its target
            if root.recursive:
                await self._arm_tree(path)
            else:
                self._add(path)

    def _remove_under(self, top: Path) -> None:
        assert self._ino is not None
        for p in [p for p in self._by_path if under(p, top)]:
            watch, _ = self._by_path.pop(p)
            self._removed.add(watch.wd)
            with contextlib.suppress(OSError):
                self._ino.rm_watch(watch)  # already gone with its directory

    async def _check_loop(self) -> None:
        """Re-arm roots whose anchors moved without telling us, and retry after ENOSPC."""
        interval = self.ctx.rescan_interval if self.ctx.rescan_interval > 0 else 15.0
        while True:
            await asyncio.sleep(interval)
            for root in self.ctx.roots:
                if self._stale(root):
                    await self._rearm_roots_near(root.path)
            if self._limited:
                self._limited = None
                await self._arm_all()
                self._emit(EventKind.RESCAN, None)  # catch up on what changed while unwatched
                if self._limited is None:
                    self._limit_logged = False
                    self.log.warning("inotify watches armed again; leaving rescan-only mode")

    def _stale(self, root: WatchRoot) -> bool:
        for p in (root.path.parent, root.path):
            held = self._by_path.get(p)
            if held is None:
                continue
            try:
                if os.stat(p).st_ino != held[1]:
                    return True
            except OSError:
                return True
        return False

    # Events ----------------------------------------------------------------------
    def _emit(self, kind: EventKind, path: Path | None) -> None:
        self.ctx.emit(SourceEvent(kind, path, self.name))

    def _root_for(self, path: Path) -> WatchRoot | None:
        return self._roots.get(path)

    async def _rearm_roots_near(self, path: Path) -> None:
        """``path`` (a root or an ancestor of roots) changed identity: re-arm what hangs below it."""
        self._remove_under(path)
        for root in self.ctx.roots:
            if under(root.path, path) or under(path, root.path):
                self._remove_under(root.path)
                await self._arm_root(root)
                self._emit(EventKind.SUBTREE, root.path)
        self._report()

    async def _handle(self, ev: Event) -> None:
        mask = int(ev.mask)
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
            await self._arm_all()  # directories created during the overflow are unwatched
            self._emit(EventKind.RESCAN, None)
            return
        watch = ev.watch
        if mask & _IGNORED:
            if watch is None or watch.wd in self._removed:
                if watch is not None:
                    self._removed.discard(watch.wd)
                return
            gone = watch.path  # the kernel dropped a watch: its directory went away
            held = self._by_path.get(gone)
            if held is not None and held[0] is watch:
                del self._by_path[gone]
            if any(under(r.path, gone) or r.path.parent == gone for r in self.ctx.roots):
                await self._rearm_roots_near(gone)
            return
        path = ev.path
        if path is None or watch is None:
            await self._arm_all()
            self._emit(EventKind.RESCAN, None)  # an event we cannot place: look everywhere
            return
        if mask & _SELF:
            if ev.name is None and any(under(r.path, path) for r in self.ctx.roots):
                await self._rearm_roots_near(path)
            return
        name = ev.name.name if ev.name is not None else ""
        if is_kubelet_internal(name):
            if name.startswith("..data"):
                self._emit(EventKind.SUBTREE, watch.path)  # a ConfigMap swap changes every key
            return
        if mask & _ISDIR:
            await self._dir_event(path, ev.mask)
            return
        if mask & _STRUCTURAL:
            if self._waiting:
                await self._maybe_waiting(path)
            root = self._root_for(path)
            if root is not None and (path.is_dir() or path in self._by_path):
                await self._rearm_roots_near(path)  # a root symlink retargeted, or replaced
                return
        if mask & _DONE:
            self._emit(EventKind.WRITTEN, path)
        elif mask & _GONE:
            self._emit(EventKind.GONE, path)
        elif mask & _MODIFY or (mask & _CREATE and _fresh_file(path)):
            self._emit(EventKind.WRITING, path)
        else:
            self._emit(EventKind.TOUCHED, path)

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

    async def _dir_event(self, path: Path, mask: Mask) -> None:
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


def _fresh_file(path: Path) -> bool:
    """A just-created empty regular file: its writer has it open (hold it until CLOSE_WRITE).

    Symlinks, hard links (``ln``), FIFOs and device nodes are created complete.
    """
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_size == 0
