"""Prune safety (``max_prune``, a Warning Event per held removal) and the move grace of a deleted file.

A part of :class:`~reloadd_kube_manifests.KubeManifestsConsumer` (see ``_parts``). The core holds the deletions
of a root that looks lost (see ``reloadd._pipeline._prune``); this part adds ``max_prune``, a limit on the
objects deleted files remove in one pass (:meth:`PrunePart._over_max_prune`), and waits out the move grace
(see ``_moves``) before a deleted file's objects are removed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from reloadd import Change, PathRecord

from .._apply import Applier
from .._applyset import ObjRef, parent_name
from .._events import record_event
from .base import ConsumerBase

__all__ = ["PASS_WINDOW", "PrunePart"]

PASS_WINDOW = 2.0
"""Seconds within which removals count as one pass for ``max_prune``: a burst the engine hands over in several
batches (their settle times differ by milliseconds) is one pass; files deleted one by one are not."""
_MAX_HELD_EVENTS = 20
"""Parents that get a Warning Event when removals are held at once (the rest are in the log line)."""


class PrunePart(ConsumerBase):
    """How much a removal deletes, when removals are held, and how long a deleted file's removal waits."""

    removal_unit = "objects"

    def removal_size(self, record: PathRecord) -> int:
        """The objects a file's removal would delete: those it applied (its record's data)."""
        data = record.data if isinstance(record.data, dict) else {}
        n = data.get("objects", data.get("applied", 0))
        return n if isinstance(n, int) else 0

    def _prune_limit(self) -> int:
        if self.settings.max_prune is not None:
            return self.settings.max_prune
        return max(10, sum(self.removal_size(r) for r in self.ctx.records.values()) // 2)

    def _over_max_prune(self, gone: Sequence[Change]) -> str | None:
        """Why removing these deleted files now would be over ``max_prune``, or ``None``.

        One pass is every removal outstanding at once (this batch's, those waiting out the move grace
        and those already held by this limit) plus what removals deleted in the last
        :data:`PASS_WINDOW` seconds, so a mass delete split over several batches is one pass.
        """
        limit = self._prune_limit()
        asked = [c.path for c in gone if not c.prune_confirmed]
        if limit == 0 or not self.settings.prune or not asked:
            return None
        now = time.monotonic()
        while self._removed and self._removed[0][0] < now - PASS_WINDOW:
            self._removed.popleft()
        self._limit_held = {p for p in self._limit_held if p in self.ctx.records and not p.exists()}
        pending = set(asked) | self._moves.paths() | self._limit_held
        sizes = {p: self.removal_size(self.ctx.records[p]) for p in pending if p in self.ctx.records}
        objects = sum(sizes.values()) + sum(n for _, n in self._removed)
        if objects <= limit:
            return None
        return (f"{len(sizes)} deleted file(s) would prune {objects} objects in one pass, over max_prune "
                f"({limit})")

    async def removals_held(self, paths: Sequence[Path], why: str) -> None:
        """A Warning Event ``PruneHeld`` on the parent of each held removal (the first 20 of a burst)."""
        if self.client is None or self.settings.dry_run:
            return
        for path in list(paths)[:_MAX_HELD_EVENTS]:
            await record_event(
                self.client, self.settings.namespace, parent_name(self.key(path)), reason="PruneHeld",
                message=f"{path}: removal of its objects held: {why}; `reloadd reload --confirm-prune` removes "
                        "them, the file coming back releases the hold",
                warning=True, component=f"reloadd/{self.name}", log=self.log,
            )

    async def _move_wait(self, applier: Applier, path: Path, claimed: set[ObjRef]) -> float:
        """Seconds the removal of deleted ``path`` still waits for the other half of a move (0: remove now)."""
        if not self.settings.prune or self._moves.grace <= 0:
            return 0.0  # nothing would be deleted, or waiting is off
        key = self.key(path)
        first = path not in self._moves
        refs: set[ObjRef] = set()
        if first:
            applier.claims.forget(key)  # the file is gone: it wants nothing, whatever its removal waits for
            refs = await applier.members(key)
        wait = self._moves.wait_for(path, key, refs, applier.claims.wanted_by_others(key) | claimed)
        if first and wait > 0:
            self.stats["removals_deferred"] += 1
            self.log.info("Removing the objects of %s in %.1fs unless another file declares them (move_grace)",
                          path, wait)
        return wait
