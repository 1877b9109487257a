"""Guarded hosts.toml: the files reloadd wrote, watched as a far-side change source (``hosts-guard``).

Anything may rewrite or delete a hosts.toml under ``hosts_dir`` (a configuration-management run, an operator's
edit, a clean-up script); containerd then pulls without the mirrors reloadd declared. This source watches
``hosts_dir`` and every host directory in it with inotify and compares each hosts.toml that changed with what
reloadd last rendered for that host: deleted or different bytes are drift, and the source emits ``DRIFTED`` for
the input that declared the host, so the engine hands it to the consumer again (``Reason.DRIFT``), which writes
it back. reloadd's own writes hold exactly the rendered bytes, so they are not drift. After every (re)arming
every host is compared once, because changes were missed while nothing watched.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from asyncinotify import Inotify, Mask

from reloadd import Drift, EventKind, SourceContext, SourceEvent, TransientError

from ._write import HOSTS_FILE, read_hosts_file

__all__ = ["HostsGuard"]

# Complete writes (CLOSE_WRITE, MOVED_TO) and removals: a file still being created says nothing yet.
_DIR_MASK = Mask.DELETE | Mask.MOVED_FROM | Mask.MOVED_TO | Mask.CLOSE_WRITE | Mask.ONLYDIR
_TOP_MASK = Mask.CREATE | Mask.DELETE | Mask.MOVED_FROM | Mask.MOVED_TO | Mask.DELETE_SELF | Mask.MOVE_SELF


class HostsGuard:
    """The ``hosts-guard`` source of one ``registry-mirrors`` consumer.

    Args:
        ctx: The source context (``emit``).
        consumer: Its consumer's name.
        hosts_dir: Where the consumer writes ``<host>/hosts.toml``.
        expected: Host directory name → (the bytes reloadd wrote last, the input that declared it).
    """

    name = "hosts-guard"

    def __init__(self, ctx: SourceContext, *, consumer: str, hosts_dir: Path,
                 expected: Callable[[], Mapping[str, tuple[bytes, Path]]]) -> None:
        self.ctx = ctx
        self.consumer = consumer
        self.hosts_dir = hosts_dir
        self.expected = expected
        self.log = logging.getLogger(f"reloadd.consumer.{consumer}.guard")

    async def run(self) -> None:
        """Watch until cancelled.

        Raises:
            TransientError: ``hosts_dir`` does not exist (yet) or went away: the supervisor arms again
                after a backoff, and compares every host then.
        """
        with Inotify() as inotify:
            try:
                inotify.add_watch(self.hosts_dir, _TOP_MASK)
                for entry in os.scandir(self.hosts_dir):
                    if entry.is_dir(follow_symlinks=False):
                        inotify.add_watch(Path(entry.path), _DIR_MASK)
            except OSError as exc:
                raise TransientError(f"cannot watch {self.hosts_dir}: {exc.strerror or exc}") from exc
            for host in list(self.expected()):
                self._check(host)
            async for event in inotify:
                if event.mask & (Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED) and event.path == self.hosts_dir:
                    raise TransientError(f"{self.hosts_dir} went away")
                if event.path is None or event.mask & Mask.Q_OVERFLOW:
                    for host in list(self.expected()):
                        self._check(host)
                    continue
                if event.path.parent == self.hosts_dir:  # a host directory came, went or was replaced
                    came = bool(event.mask & (Mask.CREATE | Mask.MOVED_TO))
                    if came and event.mask & Mask.ISDIR:
                        try:
                            inotify.add_watch(event.path, _DIR_MASK)
                        except OSError:
                            pass  # gone again: checked below
                    # A directory that just came may hold no file yet (reloadd makes one before writing into it).
                    self._check(event.path.name, missing_ok=came)
                elif event.path.name == HOSTS_FILE and event.path.parent.parent == self.hosts_dir:
                    self._check(event.path.parent.name)

    def _check(self, host: str, missing_ok: bool = False) -> None:
        want = self.expected().get(host)
        if want is None:
            return  # not a host reloadd declares (another tool's, or held by prune safety)
        text, origin = want
        have = read_hosts_file(self.hosts_dir / host)
        if have == text or (have is None and missing_ok):
            return
        what = "deleted" if have is None else "rewritten by something else"
        self.log.debug("Mirror drift: %s was %s (declared by %s)", self.hosts_dir / host / HOSTS_FILE, what, origin)
        self.ctx.emit(SourceEvent(EventKind.DRIFTED, origin, source=self.name, consumer=self.consumer,
                                  drift=Drift("file", str(self.hosts_dir / host / HOSTS_FILE), what)))
