"""The inotify source's watches: arming roots and trees, re-arming what moved, recovering from lost events.

:class:`Watches` is the base of :class:`reloadd._sources.inotify.InotifySource` that holds its watch tables
(path → watch and the inode it was armed on, wd → watch), arms a root through its nearest existing ancestor,
re-arms roots whose anchors changed identity (checked every ``rescan_interval``), retries after the watch limit
(``ENOSPC``), and recovers from lost events (an overflow): a rescan at once, every root re-armed beside the
reader, and each directory watched anew walked again. The loop side that parses reads is the source itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import time
from pathlib import Path

from asyncinotify import Inotify, Mask, Watch

from .._errors import WatchError, WatchLimitError
from .._filters import is_kubelet_internal, under
from .._source import EventKind, SourceContext, SourceEvent, WatchRoot

__all__ = ["Watches", "limit_error"]

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


def limit_error(exc: OSError, path: Path) -> WatchError:
    """The error an inotify call's ``OSError`` means: the watch or instance limit (naming its sysctl), or else."""
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

class Watches:
    """An inotify source's watches and their recovery; the tables are set up by the source's ``__init__``."""

    name: str
    ctx: SourceContext
    log: logging.Logger | logging.LoggerAdapter[logging.Logger]
    _ino: Inotify | None
    _by_path: dict[Path, tuple[Watch, int]]
    _by_wd: dict[int, tuple[Watch, str]]
    _removed: set[int]
    _waiting: dict[Path, Path]
    _limited: str | None
    _limit_logged: bool
    _roots: dict[Path, WatchRoot]
    _recovery: asyncio.Task[None] | None
    _recover_again: bool

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
            err = limit_error(exc, path)
            if isinstance(err, WatchLimitError) and err.sysctl == "fs.inotify.max_user_watches":
                if not self._limit_logged:
                    self.log.error("%s", err)
                    self._limit_logged = True
                self._limited = str(err)
                return False
            raise err from exc
        self._removed.discard(watch.wd)
        self._by_path[path] = (watch, ino)
        self.ctx.coverage.add(str(path))
        prefix = str(watch.path)
        self._by_wd[watch.wd] = (watch, prefix if prefix.endswith("/") else prefix + "/")
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
            self.ctx.coverage.discard(str(p))
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

    def _emit(self, kind: EventKind, path: Path | str | None) -> None:
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

    def _recover(self) -> None:
        """Events were lost: rescan at once, re-arm every root, and look again at directories armed anew.

        The rescan of every root is asked for first, so it starts while the watches are re-armed
        (a directory made while events were lost has none yet). Each directory the re-arm had to
        watch anew is then handed over as a subtree, walked again now that its watch reports
        what changes in it: a file made there after the rescan passed and before the watch
        existed is found by that walk.

        Runs beside the reader, not in it: a reader waiting for the re-arm lets the
        kernel queue overflow again, and a burst turns into a chain of overflows. Lost
        events arriving while one recovery runs ask for their rescan at once (the engine
        stops a walk already running for it) and make the re-arm go round once more.
        """
        self.ctx.emit(SourceEvent(EventKind.RESCAN, None, self.name, lost_at=time.monotonic()))
        if self._recovery is not None and not self._recovery.done():
            self._recover_again = True
            return
        self._recovery = asyncio.get_running_loop().create_task(self._recovery_run(), name="reloadd-inotify-rearm")

    async def _recovery_run(self) -> None:
        again = True
        while again:
            self._recover_again = False
            watched = {p: ino for p, (_, ino) in self._by_path.items()}
            await self._arm_all()
            tops: list[Path] = []  # the directories watched anew (or a new one under the same name), outermost
            for p in sorted(p for p, (_, ino) in self._by_path.items() if watched.get(p) != ino):
                if not (tops and under(p, tops[-1])):  # sorted by parts: what lies under a directory follows it
                    tops.append(p)
                    self._emit(EventKind.SUBTREE, p)
            again = self._recover_again
