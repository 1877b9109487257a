"""The inotify source (asyncinotify): kernel events turned into :class:`SourceEvent` values.

What the peers get wrong and this gets right (see shared notes, watchers-and-reloaders):

- Each root's *parent* is watched too, so a root deleted and recreated is armed again;
  a root that does not exist yet is watched through its nearest existing ancestor.
- New sub-directories are armed and re-examined at once (files made before the watch
  existed are not missed).
- ``IN_Q_OVERFLOW``, an event with no path, and ``IGNORED``/``DELETE_SELF``/``MOVE_SELF``/
  ``UNMOUNT`` on a root mean "rescan now", never silence.
- The read batch is raised from asyncinotify's 10 events to 1024.
- ``ENOSPC``/``EMFILE`` become :class:`WatchLimitError` naming the sysctl to raise.
"""

from __future__ import annotations

import errno
import os
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


def _map_oserror(exc: OSError, path: Path) -> WatchError:
    if exc.errno == errno.ENOSPC:
        return WatchLimitError(
            f"Failed to watch {path}: the inotify watch limit is reached; raise the sysctl "
            "fs.inotify.max_user_watches (continuing with rescans only)",
            "fs.inotify.max_user_watches",
        )
    if exc.errno == errno.EMFILE:
        return WatchLimitError(
            "Failed to create an inotify instance: the limit is reached; raise the sysctl "
            "fs.inotify.max_user_instances or the open-files limit (continuing with rescans only)",
            "fs.inotify.max_user_instances",
        )
    return WatchError(f"Failed to watch {path}: {exc.strerror or exc}")


class InotifySource:
    """Watch every root (recursively where asked) and report what the kernel says."""

    name = "inotify"

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx
        self.log = ctx.logger
        self._ino: Inotify | None = None
        self._by_path: dict[Path, Watch] = {}
        self._removed: set[int] = set()
        self._waiting: dict[Path, Path] = {}  # missing root -> ancestor watched for it

    @property
    def watch_count(self) -> int:
        """Watches currently held."""
        return len(self._by_path)

    async def run(self) -> None:
        """Arm every root and translate events until cancelled."""
        try:
            ino = Inotify(cache_size=_READ_BATCH)
        except OSError as exc:
            raise _map_oserror(exc, Path("/")) from exc
        self._ino = ino
        try:
            for root in self.ctx.roots:
                self._arm_root(root)
            self.ctx.degraded(None)
            async for event in ino:
                self._handle(event)
        finally:
            self._ino = None
            self._by_path.clear()
            self._removed.clear()
            self._waiting.clear()
            ino.close()

    # Arming ----------------------------------------------------------------------
    def _add(self, path: Path) -> bool:
        assert self._ino is not None
        if path in self._by_path:
            return True
        try:
            watch = self._ino.add_watch(path, _MASK)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return False
            if exc.errno == errno.EACCES:
                self.log.warning("Failed to watch %s: permission denied (covered by rescans only)", path)
                return False
            raise _map_oserror(exc, path) from exc
        self._removed.discard(watch.wd)
        self._by_path[path] = watch
        return True

    def _arm_tree(self, top: Path) -> None:
        """Watch ``top`` and every sub-directory (not through symlinks, not ``..`` dirs)."""
        stack = [top]
        while stack:
            d = stack.pop()
            if not self._add(d):
                continue
            try:
                with os.scandir(d) as it:
                    for entry in it:
                        try:
                            if entry.is_dir(follow_symlinks=False) and not is_kubelet_internal(entry.name):
                                stack.append(Path(entry.path))
                        except OSError:
                            continue
            except OSError:
                continue

    def _arm_root(self, root: WatchRoot) -> None:
        path = root.path
        # Watch the nearest existing ancestor (normally the parent) for the root's own fate.
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
        if path.is_dir():
            if root.recursive:
                self._arm_tree(path)
            else:
                self._add(path)

    def _remove_under(self, top: Path) -> None:
        assert self._ino is not None
        for p in [p for p in self._by_path if under(p, top)]:
            watch = self._by_path.pop(p)
            self._removed.add(watch.wd)
            try:
                self._ino.rm_watch(watch)
            except OSError:
                pass  # already gone with its directory

    # Events ----------------------------------------------------------------------
    def _emit(self, kind: EventKind, path: Path | None) -> None:
        self.ctx.emit(SourceEvent(kind, path, self.name))

    def _root_for(self, path: Path) -> WatchRoot | None:
        for root in self.ctx.roots:
            if root.path == path:
                return root
        return None

    def _rearm_roots_near(self, path: Path) -> None:
        """Something happened to ``path``, which is a root or an ancestor of roots."""
        for root in self.ctx.roots:
            if under(root.path, path):
                self._remove_under(root.path)
                self._arm_root(root)
                self._emit(EventKind.SUBTREE, root.path)

    def _handle(self, ev: Event) -> None:
        mask = ev.mask
        if Mask.Q_OVERFLOW in mask:
            self.log.warning("inotify queue overflowed (fs.inotify.max_queued_events); rescanning every root")
            self._emit(EventKind.RESCAN, None)
            return
        watch = ev.watch
        if Mask.IGNORED in mask:
            if watch is None or watch.wd in self._removed:
                if watch is not None:
                    self._removed.discard(watch.wd)
                return
            # The kernel dropped a watch (its directory went away or was unmounted).
            gone = watch.path
            if self._by_path.get(gone) is watch:
                del self._by_path[gone]
            if any(under(r.path, gone) or r.path.parent == gone for r in self.ctx.roots):
                self._rearm_roots_near(gone)
            return
        path = ev.path
        if path is None or watch is None:
            self._emit(EventKind.RESCAN, None)  # an event we cannot place: look everywhere
            return
        if mask & (Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.UNMOUNT):
            if ev.name is None and any(under(r.path, path) for r in self.ctx.roots):
                self._rearm_roots_near(path)
            return
        name = ev.name.name if ev.name is not None else ""
        if is_kubelet_internal(name):
            if name.startswith("..data"):
                self._emit(EventKind.SUBTREE, watch.path)  # a ConfigMap swap changes every key
            return
        if Mask.ISDIR in mask:
            self._dir_event(path, mask)
            return
        if mask & (Mask.CREATE | Mask.MOVED_TO):
            self._maybe_waiting(path)
        if Mask.CLOSE_WRITE in mask or Mask.MOVED_TO in mask:
            self._emit(EventKind.WRITTEN, path)
        elif mask & (Mask.DELETE | Mask.MOVED_FROM):
            self._emit(EventKind.GONE, path)
        elif Mask.MODIFY in mask:
            self._emit(EventKind.WRITING, path)
        else:
            self._emit(EventKind.TOUCHED, path)

    def _maybe_waiting(self, path: Path) -> None:
        """A component of a root that did not exist appeared: arm that root again."""
        for root_path, anchor in list(self._waiting.items()):
            if path.parent == anchor and under(root_path, path):
                root = self._root_for(root_path)
                if root is not None:
                    self._arm_root(root)
                    if root_path not in self._waiting:
                        self.log.warning("Root %s appeared; watching it", root_path)
                    self._emit(EventKind.SUBTREE, root_path)

    def _dir_event(self, path: Path, mask: Mask) -> None:
        if mask & (Mask.CREATE | Mask.MOVED_TO):
            self._maybe_waiting(path)
            root = self._root_for(path)
            if root is not None:
                self._remove_under(path)
                self._arm_root(root)
            else:
                owner = next((r for r in self.ctx.roots if under(path, r.path) and r.path != path), None)
                if owner is None:
                    return
                if owner.recursive:
                    self._arm_tree(path)
            self._emit(EventKind.SUBTREE, path)
        elif mask & (Mask.DELETE | Mask.MOVED_FROM):
            self._remove_under(path)
            if self._root_for(path) is not None:
                self._rearm_roots_near(path)
            else:
                self._emit(EventKind.SUBTREE, path)
