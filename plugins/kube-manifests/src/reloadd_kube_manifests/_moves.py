"""The move grace: a deleted file's objects wait a moment for the file to reappear elsewhere.

``mkdir new && mv dir/app.yaml new/`` reaches the consumer in two batches: the delete at once, the new
folder's file only once the engine has watched and walked the new folder. Removing the old set straight
away would delete every object and let the new file create them again, with new uids. So the removal of a
deleted file waits up to ``move_grace`` seconds. A file that appears meanwhile and declares some of its
objects (same group, kind, namespace and name) relabels them into its own set when it is applied, and the
removal, when it runs, deletes only what is still labelled with the old set. So "the same content" is decided
per object, by the identity the API server itself uses: a pure move keeps everything, an edited move keeps
what it still declares, and an unrelated file (whatever its name) keeps nothing. It is the rule a rename
within one batch and concurrent batches already follow (see ``_claims``), stretched over a short time.

While it waits, the removal answers :class:`reloadd.Retry`, which leaves the path's record alone: the
delete is acknowledged (and forgotten by the engine) only after the removal has run, so a restart in the
middle of the window hands the delete over again and never loses the prune (the window starts again). No
batch is held while waiting, so the delete blocks no other file. A timer asks the engine for the path
again when the window ends, or as soon as every object of the set has been declared by another file.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from ._applyset import ObjRef

__all__ = ["MoveGrace"]

log = logging.getLogger(__name__)


@dataclass
class _Waiting:
    key: str
    refs: frozenset[ObjRef]
    deadline: float
    timer: asyncio.TimerHandle | None = None
    woken: bool = False


class MoveGrace:
    """Deleted files whose removal waits for a move target.

    Args:
        grace: Seconds a removal waits (0 disables waiting).
        trigger: Asks the engine to hand paths over again (the consumer context's ``trigger``).
        clock: Monotonic clock.
    """

    def __init__(
        self, grace: float, trigger: Callable[[Iterable[Path] | None], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.grace = grace
        self._trigger = trigger
        self._clock = clock
        self._waiting: dict[Path, _Waiting] = {}

    def __contains__(self, path: Path) -> bool:
        return path in self._waiting

    def paths(self) -> set[Path]:
        """The deleted files whose removal waits."""
        return set(self._waiting)

    def wait_for(self, path: Path, key: str, refs: Collection[ObjRef], spared: Collection[ObjRef]) -> float:
        """Seconds the removal of ``path`` must still wait (0: remove it now).

        ``refs`` are the objects of the deleted file's set (its parent's inventory), read on the first call;
        ``spared`` are the objects other files declare. A removal waits while some of its objects have no
        other file, and the window that began at its first call is not over.
        """
        now = self._clock()
        waiting = self._waiting.get(path)
        if waiting is None:
            if self.grace <= 0 or not refs or set(refs) <= set(spared):
                return 0.0
            waiting = self._waiting[path] = _Waiting(key, frozenset(refs), now + self.grace)
            waiting.timer = asyncio.get_running_loop().call_later(self.grace, self._wake, path)
        if waiting.refs <= set(spared):
            return 0.0
        left = max(0.0, waiting.deadline - now)
        if left > 0 and waiting.timer is None:  # woken early, but the file that took the objects went again
            waiting.woken = False
            waiting.timer = asyncio.get_running_loop().call_later(left, self._wake, path)
        return left

    def adopted(self, wanted_by_others: Callable[[str], Collection[ObjRef]]) -> None:
        """A file was applied: wake every waiting removal whose objects all have another file now."""
        for path, waiting in self._waiting.items():
            if not waiting.woken and waiting.refs <= set(wanted_by_others(waiting.key)):
                self._wake(path)

    def _wake(self, path: Path) -> None:
        waiting = self._waiting.get(path)
        if waiting is None:
            return
        if waiting.timer is not None:
            waiting.timer.cancel()
            waiting.timer = None
        waiting.woken = True
        try:
            self._trigger([path])
        except RuntimeError as exc:  # the engine is gone (shutting down): the next start hands the path over
            log.debug("Failed to ask for %s again: %s", path, exc)

    def done(self, path: Path) -> None:
        """The removal ran (or the file came back): stop waiting for ``path``."""
        waiting = self._waiting.pop(path, None)
        if waiting is not None and waiting.timer is not None:
            waiting.timer.cancel()

    def close(self) -> None:
        """Cancel every timer (the records still name the paths: the next start hands them over again)."""
        for path in list(self._waiting):
            self.done(path)
