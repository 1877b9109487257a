"""What the engine's pump is doing and what it waits for: one small state, its transitions in one place.

The pump (:meth:`~reloadd._pipeline._intake.Intake.pump`) turns: it waits for an event or a deadline, takes
what was queued, acts on it (a walk, a forced pass), then settles what is due. Whether a turn settles, and how
soon the next one may, depends on what happened meanwhile: a source lost events while the pump worked (their
rescan goes first), the last settling step took everything due (the next waits out :data:`CADENCE`), a periodic
rescan fell due while paths settled (it waits for them, see ``rescan_wait``), sources hold reads back (every
consumer holds). :class:`PumpState` keeps all of that, and the engine changes it only through its methods, so a
newcomer changing when a rescan runs reads one class, not six flags spread over a 1,000-line module.

The transitions run once per turn of the pump or per settling step, never per event: nothing here is on the
per-path hot path.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["CADENCE", "Awaits", "Doing", "PumpState"]

CADENCE = 0.02  # seconds at least between settling steps that each took all that was due (a trickle; see cadence)


class Doing(enum.Enum):
    """What the pump loop is doing."""

    WAITING = "waiting"
    """For an event, a deadline or its turn: nothing taken."""
    WORKING = "working"
    """Acting on the events it took, then settling what is due (what ``Engine.busy`` reports)."""


class Awaits(enum.Enum):
    """What settling waits for, besides paths falling due."""

    NOTHING = "nothing"
    """What is due settles in this turn (at the :meth:`PumpState.cadence`)."""
    LOSS = "loss"
    """A source lost events and the pump has not taken that in: if it came while the pump worked, the turn puts
    settling off so that the loss's rescan, queued now, goes first."""
    RESCAN = "rescan"
    """The last turn put settling off for a loss's rescan: the next one settles whatever comes (a newer loss
    meanwhile does not put it off a second time)."""


@dataclass(slots=True)
class PumpState:
    """The pump's state: what it is doing, what settling waits for, and the timestamps its timing reads.

    Timestamps are ``time.monotonic()`` seconds.
    """

    doing: Doing = Doing.WAITING
    awaits: Awaits = Awaits.NOTHING
    settled_at: float | None = None
    """The latest settling step that handed something over and took everything due at its time; the next one
    waits out :data:`CADENCE` from then (``None``: the latest was cut short by its size, or none yet)."""
    rescan_since: float | None = None
    """When a periodic rescan began waiting for the paths settling (``None``: none waits)."""
    held_reads: int = 0
    """Sources waiting in ``Engine.room`` now, with events read and not looked at."""
    last_loss: float = float("-inf")
    """The latest loss of events a source reported (settling goes in small steps for a while after it)."""

    # The turn ---------------------------------------------------------------------
    def lost(self, now: float) -> None:
        """A source reported a loss of events (its rescan event is queued)."""
        self.last_loss = now
        if self.awaits is Awaits.NOTHING:
            self.awaits = Awaits.LOSS  # a put-off turn's next one settles all the same: RESCAN stays

    def take(self) -> None:
        """The pump took every event queued: it works on them, and any loss among them is in hand."""
        self.doing = Doing.WORKING
        if self.awaits is Awaits.LOSS:
            self.awaits = Awaits.NOTHING

    def settles(self) -> bool:
        """The pump acted on what it took: whether this turn settles (cadence aside).

        Events lost while it worked put settling off for their rescan, which goes first in the next turn; that
        turn settles whatever comes (settling waits one turn, never two).
        """
        if self.awaits is Awaits.LOSS:
            self.awaits = Awaits.RESCAN
            return False
        self.awaits = Awaits.NOTHING
        return True

    def done(self) -> None:
        """The turn ended (settled or not, or failed): the pump waits again."""
        self.doing = Doing.WAITING

    def restart(self) -> None:
        """A pump starts (again, after one failed): it waits, and a turn the failed one put off is forgotten."""
        self.doing = Doing.WAITING
        if self.awaits is Awaits.RESCAN:
            self.awaits = Awaits.NOTHING

    # Settling steps -----------------------------------------------------------------
    def settled(self, now: float, drained: bool) -> None:
        """A settling step handed paths over; ``drained``: it took everything due at its time (see :meth:`cadence`)."""
        self.settled_at = now if drained else None

    def cadence(self, now: float) -> float:
        """Seconds the next settling step waits: while paths trickle in, steps come at most every :data:`CADENCE`.

        A step that took everything due at its time is followed by the next one no sooner than ``CADENCE``
        later: paths falling due one after another (a writer at a few thousand files a second) go in a step
        and a batch every 20 ms, not one each a few milliseconds apart (each step and batch costs thread
        hand-offs, a prune verdict, a journal write). A step cut short by its size is followed at once.
        """
        at = self.settled_at
        if at is None:
            return 0.0
        return max(0.0, at + CADENCE - now)

    # A periodic rescan waiting for the paths settling ---------------------------------
    def rescan_due(self, now: float, wait: float, settling: bool) -> bool:
        """A periodic rescan fell due: whether it waits (again) for the paths ``settling``, ``wait`` seconds at most.

        It starts waiting (:attr:`rescan_since` set) or goes on waiting; else it runs, and waits no more.
        """
        since = self.rescan_since
        if wait > 0.0 and settling and (since is None or now - since < wait):
            if since is None:
                self.rescan_since = now
            return True
        self.rescan_since = None
        return False

    def rescan_ran(self) -> None:
        """A walk of every root runs now: a periodic rescan waiting is done with it."""
        self.rescan_since = None

    def rescan_left(self, now: float, wait: float) -> float | None:
        """Seconds a periodic rescan still waits at most (``None``: none waits; ``<= 0``: its time is up)."""
        since = self.rescan_since
        return None if since is None else since + wait - now

    # Sources holding reads back ---------------------------------------------------------
    def hold_reads(self) -> None:
        """A source waits for room, with events read and not handed in."""
        self.held_reads += 1

    def reads_go_on(self) -> None:
        """A source that waited for room goes on (room came, or its wait timed out)."""
        self.held_reads -= 1
