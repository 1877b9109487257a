"""Which files want which objects, so that concurrent batches never delete what another file is applying.

With ``concurrency`` above 1 the engine hands the consumer several batches at once (never one path twice).
Files are separate ApplySets, so their applies may overlap freely. Deletes are the danger: a removal (or a
prune) lists members still labelled with its set and deletes them with a ``uid`` precondition, and an apply
of another file that declares the same object (a rename or a move split over two batches) may relabel it
in between; the ``uid`` still matches, and the object would be deleted although a file wants it.

So every apply declares its objects (:meth:`Claims.want`) before it writes any, and every delete pass
chooses its victims among objects no other file wants and announces them (:meth:`Claims.deleting`). Both
steps are synchronous, so one of two racing files always sees the other: either the delete spares the
object, or the apply waits until that delete pass has finished and then (re)creates it. Nothing waits on
anything else, so a file stuck in retries holds back only a file that wants the very objects it deletes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import TypeVar

from ._applyset import ObjRef

__all__ = ["Claims"]

T = TypeVar("T")


class Claims:
    """The objects each file (by ApplySet key) wants, and the delete passes in progress."""

    def __init__(self) -> None:
        self._wanted: dict[str, frozenset[ObjRef]] = {}
        self._deleting: dict[int, tuple[str, frozenset[ObjRef], asyncio.Event]] = {}
        self._next = 0

    def wanted_by_others(self, key: str) -> set[ObjRef]:
        """Everything the files other than ``key`` want."""
        return set().union(*(refs for k, refs in self._wanted.items() if k != key))

    async def want(self, key: str, refs: Collection[ObjRef]) -> None:
        """Record that ``key`` wants ``refs`` (replacing what it wanted), then wait out clashing deletes."""
        mine = frozenset(refs)
        if mine:
            self._wanted[key] = mine
        else:
            self._wanted.pop(key, None)  # wanting nothing is not wanting: no entry (10,000 empty files, no sets)
        while True:
            clashes = [ev for k, doomed, ev in self._deleting.values() if k != key and doomed & mine]
            if not clashes:
                return
            await asyncio.gather(*(ev.wait() for ev in clashes))

    def forget(self, key: str) -> None:
        """``key``'s file is gone (deleted or disabled): it wants nothing any more."""
        self._wanted.pop(key, None)

    @contextlib.contextmanager
    def deleting(
        self, key: str, candidates: Iterable[T], ref: Callable[[T], ObjRef], keep: Collection[ObjRef] = ()
    ) -> Iterator[list[T]]:
        """Choose, among ``candidates``, those no other file wants (nor ``keep``); hold them while deleting."""
        spared = self.wanted_by_others(key).union(keep)
        chosen = [c for c in candidates if ref(c) not in spared]
        token = self._next
        self._next += 1
        done = asyncio.Event()
        self._deleting[token] = (key, frozenset(ref(c) for c in chosen), done)
        try:
            yield chosen
        finally:
            del self._deleting[token]
            done.set()
