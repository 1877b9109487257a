"""A consumer's held removals as its work queue keeps them (see :mod:`reloadd._pipeline._prune` for the rule).

A removal the engine judged held, or one the consumer answered :class:`~reloadd.Hold` for, waits here,
outside the queue's work: it holds back no other path and no consumer ordered ``after`` this one, and
readiness ignores it. The guard's table (persisted) says why and since when; this keeps the items, so a
confirm hands exactly them over again, and says so once per reason (a WARNING and the consumer's
``removals_held`` hook).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .._consumer import Consumer, PruneAware
from .._types import PathRecord
from ._changes import repeats
from ._item import Item
from ._prune import PruneGuard

__all__ = ["HeldRemovals"]

log = logging.getLogger("reloadd.queue")


class HeldRemovals:
    """The held removals of one consumer.

    Args:
        consumer: The consumer (its name, ``removal_size`` and ``removals_held`` hook).
        guard: Its prune guard (the persisted table).
        records: Its live records, by path string.
        persist: Asks the queue to write the guard's table soon.
        on_change: Something a status reader sees changed.
    """

    def __init__(self, consumer: Consumer, guard: PruneGuard, records: Mapping[str, PathRecord],
                 persist: Callable[[], None], on_change: Callable[[], None]) -> None:
        self.consumer = consumer
        self.guard = guard
        self._recs = records
        self._persist = persist
        self._on_change = on_change
        self.items: dict[str, Item] = {}  # held this run (the guard also lists holds of earlier runs)
        self._announce: dict[str, list[str]] = {}  # new holds not yet logged, by why
        self.background: set[asyncio.Task[None]] = set()

    def __contains__(self, key: object) -> bool:
        return key in self.items

    def concerns(self, item: Item) -> bool:
        """Whether ``item`` is a held removal, or a change of a path whose removal is held."""
        return item.hold is not None or item.key in self.items or item.key in self.guard.held

    def absorb(self, item: Item) -> bool:
        """Whether ``item`` is taken up by the held state (else it goes through the queue's ordinary rules).

        A removal judged held is kept (never acknowledged: nothing to remove, nothing to keep); the path
        found again as it was held stays held; anything else ends the hold (the input came back).
        """
        key = item.key
        if item.hold is not None:
            if self._recs.get(key) is not None:
                self.hold(item, item.hold)
            return True
        held = self.items.get(key)
        if held is not None and repeats(held, item):
            return True  # found again as it was held (a consumer's own Hold of this content)
        self.items.pop(key, None)
        if self.guard.release(key):
            log.info("Released the held removal of %s in consumer %s: the path is back", key, self.consumer.name)
            self._persist()
            self._on_change()
        return False

    def hold(self, item: Item, why: str) -> None:
        """Keep ``item`` held for ``why`` (the queue has taken it out of its work)."""
        item.hold = why
        item.confirmed = False
        item.checked = False
        item.attempts = 0
        item.last_error = item.deferred = None
        item.not_before = 0.0
        self.items[item.key] = item
        _, new = self.guard.hold(item.key, why)
        if new:
            if not self._announce:
                asyncio.get_running_loop().call_soon(self._announce_holds)
            self._announce.setdefault(why, []).append(item.key)
        self._persist()
        self._on_change()

    def confirm(self, now: float) -> tuple[int, list[Item]]:
        """A person confirmed: how many removals run, and the items to queue again (flagged ``confirmed``).

        Holds persisted by an earlier run whose deletion was not handed over again yet are confirmed
        too: they run as soon as it is.
        """
        keys = self.guard.confirm()
        again = []
        for key in keys:
            item = self.items.pop(key, None)
            if item is None:
                continue
            item.hold = None
            item.confirmed = True
            item.since = now
            again.append(item)
        if keys:
            log.warning("Running %d held removal(s) of consumer %s: confirmed by an operator",
                        len(keys), self.consumer.name)
            self._persist()
        return len(keys), again

    def listing(self) -> list[dict[str, Any]]:
        """Each held removal: its path, why, since (wall clock) and size (what it would remove)."""
        size = self.consumer.removal_size if isinstance(self.consumer, PruneAware) else None
        out = []
        for key, h in sorted(self.guard.held.items()):
            n = 1
            rec = self._recs.get(key)
            if size is not None and rec is not None:
                try:
                    n = int(size(rec))
                except Exception:  # a plugin's count must not break status
                    n = 1
            out.append({"path": key, "why": h.why, "since": round(h.since, 3), "size": n})
        return out

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` beside the queue (cancelled when it drains)."""
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def _announce_holds(self) -> None:
        """One WARNING per reason for the holds of one turn of the loop, and the consumer's hook."""
        announce, self._announce = self._announce, {}
        hook = self.consumer.removals_held if isinstance(self.consumer, PruneAware) else None
        for why, keys in announce.items():
            shown = ", ".join(sorted(keys)[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
            log.warning(
                "Holding the removal of %d path(s) of consumer %s: %s (%s); nothing is removed until they "
                "come back or `reloadd reload --confirm-prune` is run", len(keys), self.consumer.name, why, shown,
            )
            if hook is not None:
                self.spawn(self._call_hook(hook, [Path(k) for k in sorted(keys)], why))

    async def _call_hook(self, hook: Callable[..., Any], paths: list[Path], why: str) -> None:
        try:
            await hook(paths, why)
        except Exception as exc:  # a report that failed must not stop the queue
            log.warning("Failed to report held removals of consumer %s: %s", self.consumer.name, exc)
