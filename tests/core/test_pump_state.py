"""The pump's state (#63): each transition of :class:`PumpState` alone, the old flags it replaced, and a real engine.

The pump steered by six flags and timestamps spread over the engine (``deferred``, ``_loss_waiting``,
``_rescan_since``, ``_drained``, ``_holding_reads``, ``_settled_at``); they are one state now, changed only
through its methods. Each transition is checked here state before → event → state after (and an event that
does not concern a state leaves it as it was), the loss handling is checked against the two flags it replaced
over every short sequence of turns, and a real Reloader is watched going through the states.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reloadd._pipeline._pump_state import CADENCE, Awaits, Doing, PumpState
from reloadd._source import EventKind, SourceEvent
from tests.waiting import until

pytestmark = pytest.mark.timeout(60)

WAITING, WORKING = Doing.WAITING, Doing.WORKING
NOTHING, LOSS, RESCAN = Awaits.NOTHING, Awaits.LOSS, Awaits.RESCAN


def state(doing: Doing = WAITING, awaits: Awaits = NOTHING, **fields: Any) -> PumpState:
    return PumpState(doing, awaits, **fields)


def test_a_new_pump_waits_for_nothing() -> None:
    s = PumpState()
    assert (s.doing, s.awaits, s.settled_at, s.rescan_since, s.held_reads) == (WAITING, NOTHING, None, None, 0)
    assert s.cadence(0.0) == 0.0
    assert time.monotonic() - s.last_loss > 1e9  # no loss yet: no storm of small settling steps


# lost ---------------------------------------------------------------------------------
@pytest.mark.parametrize("doing", [WAITING, WORKING])
def test_a_loss_makes_settling_wait_for_its_rescan(doing: Doing) -> None:
    s = state(doing, NOTHING)
    s.lost(12.5)
    assert (s.doing, s.awaits, s.last_loss) == (doing, LOSS, 12.5)


def test_a_second_loss_before_the_pump_takes_the_first_changes_nothing_but_its_time() -> None:
    s = state(WORKING, LOSS, last_loss=1.0)
    s.lost(2.0)
    assert (s.doing, s.awaits, s.last_loss) == (WORKING, LOSS, 2.0)


@pytest.mark.parametrize("doing", [WAITING, WORKING])
def test_a_loss_after_a_put_off_turn_does_not_put_settling_off_again(doing: Doing) -> None:
    s = state(doing, RESCAN)
    s.lost(3.0)
    assert (s.doing, s.awaits, s.last_loss) == (doing, RESCAN, 3.0)


# take ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("before", "after"), [(NOTHING, NOTHING), (LOSS, NOTHING), (RESCAN, RESCAN)])
def test_taking_the_events_starts_work_with_any_loss_in_hand(before: Awaits, after: Awaits) -> None:
    s = state(WAITING, before)
    s.take()
    assert (s.doing, s.awaits) == (WORKING, after)


# settles ------------------------------------------------------------------------------
@pytest.mark.parametrize(("before", "settles", "after"),
                         [(NOTHING, True, NOTHING), (LOSS, False, RESCAN), (RESCAN, True, NOTHING)])
def test_a_turn_settles_unless_events_were_lost_while_it_worked(before: Awaits, settles: bool, after: Awaits) -> None:
    s = state(WORKING, before)
    assert s.settles() is settles
    assert (s.doing, s.awaits) == (WORKING, after)  # still working: settling is part of the turn


# done ---------------------------------------------------------------------------------
@pytest.mark.parametrize("awaits", list(Awaits))
def test_a_turn_done_waits_again_and_keeps_what_settling_waits_for(awaits: Awaits) -> None:
    s = state(WORKING, awaits, settled_at=4.0, rescan_since=3.0)
    s.done()
    assert (s.doing, s.awaits, s.settled_at, s.rescan_since) == (WAITING, awaits, 4.0, 3.0)


# restart ------------------------------------------------------------------------------
@pytest.mark.parametrize(("doing", "before", "after"),
                         [(WORKING, RESCAN, NOTHING), (WAITING, RESCAN, NOTHING), (WORKING, LOSS, LOSS),
                          (WAITING, NOTHING, NOTHING)])
def test_a_restarted_pump_forgets_a_put_off_turn_but_not_a_queued_loss(doing: Doing, before: Awaits,
                                                                        after: Awaits) -> None:
    s = state(doing, before, held_reads=1, rescan_since=2.0)
    s.restart()
    assert (s.doing, s.awaits, s.held_reads, s.rescan_since) == (WAITING, after, 1, 2.0)


# settled and the cadence ----------------------------------------------------------------
def test_a_step_that_took_all_that_was_due_paces_the_next() -> None:
    s = state(WORKING)
    s.settled(10.0, drained=True)
    assert s.settled_at == 10.0
    assert s.cadence(10.0) == pytest.approx(CADENCE)
    assert s.cadence(10.0 + CADENCE / 2) == pytest.approx(CADENCE / 2)
    assert s.cadence(10.0 + CADENCE) == 0.0
    assert s.cadence(11.0) == 0.0


def test_a_step_cut_short_by_its_size_is_followed_at_once() -> None:
    s = state(WORKING, settled_at=10.0)
    s.settled(10.5, drained=False)
    assert s.settled_at is None
    assert s.cadence(10.5) == 0.0


# a periodic rescan waiting ---------------------------------------------------------------
def test_a_periodic_rescan_falling_due_while_paths_settle_starts_waiting() -> None:
    s = state()
    assert s.rescan_due(5.0, wait=30.0, settling=True)
    assert s.rescan_since == 5.0
    assert s.rescan_left(6.0, 30.0) == 29.0


def test_a_periodic_rescan_waiting_goes_on_waiting_from_when_it_began() -> None:
    s = state(rescan_since=5.0)
    assert s.rescan_due(20.0, wait=30.0, settling=True)
    assert s.rescan_since == 5.0


@pytest.mark.parametrize(("since", "now", "wait", "settling"),
                         [(5.0, 35.0, 30.0, True),  # waited its time: it runs
                          (5.0, 6.0, 30.0, False),  # nothing settles any more
                          (None, 6.0, 30.0, False),  # nothing settling: it never waits
                          (None, 6.0, 0.0, True)])  # rescan_wait 0: it never waits
def test_a_periodic_rescan_runs_when_nothing_settles_or_its_wait_is_up(since: float | None, now: float, wait: float,
                                                                       settling: bool) -> None:
    s = state(rescan_since=since)
    assert not s.rescan_due(now, wait=wait, settling=settling)
    assert s.rescan_since is None
    assert s.rescan_left(now, wait) is None


@pytest.mark.parametrize("since", [None, 5.0])
def test_a_walk_of_every_root_ends_any_periodic_rescan_waiting(since: float | None) -> None:
    s = state(WORKING, LOSS, rescan_since=since)
    s.rescan_ran()
    assert (s.doing, s.awaits, s.rescan_since) == (WORKING, LOSS, None)


def test_rescan_left_counts_down_and_goes_negative_when_the_wait_is_up() -> None:
    s = state(rescan_since=5.0)
    assert s.rescan_left(5.0, 1.0) == 1.0
    assert s.rescan_left(7.0, 1.0) == -1.0


# reads held back ----------------------------------------------------------------------------
def test_sources_holding_reads_back_are_counted_until_they_go_on() -> None:
    s = state(WORKING, RESCAN)
    s.hold_reads()
    s.hold_reads()
    assert s.held_reads == 2
    s.reads_go_on()
    assert (s.held_reads, s.doing, s.awaits) == (1, WORKING, RESCAN)
    s.reads_go_on()
    assert s.held_reads == 0


# the flags it replaced -------------------------------------------------------------------------
class _OldFlags:
    """The pump's loss handling as two flags (before #63): ``_loss_waiting`` and the loop's local ``deferred``."""

    def __init__(self) -> None:
        self.loss_waiting = False
        self.deferred = False

    def turn(self, loss_meanwhile: bool, fails: bool) -> bool | None:
        self.loss_waiting = False  # taken with the events
        if loss_meanwhile:
            self.loss_waiting = True
        if fails:
            self.deferred = False  # a new pump: a new local
            return None
        self.deferred = self.loss_waiting and not self.deferred
        return not self.deferred


def _new_turn(s: PumpState, loss_meanwhile: bool, fails: bool) -> bool | None:
    s.take()
    if loss_meanwhile:
        s.lost(0.0)
    if fails:
        s.done()
        s.restart()
        return None
    settles = s.settles()
    s.done()
    return settles


def test_the_state_settles_in_the_same_turns_as_the_two_flags_it_replaced() -> None:
    """Every sequence of up to six events (a loss while the pump waits; a turn, with or without a loss while it
    works, or failing) gives the same turn-by-turn answer to "does this turn settle?"."""
    events = ["loss", "turn", "turn+loss", "fail", "fail+loss"]
    for n in range(1, 7):
        for seq in itertools.product(events, repeat=n):
            old, new = _OldFlags(), PumpState()
            for ev in seq:
                if ev == "loss":
                    old.loss_waiting = True
                    new.lost(0.0)
                    continue
                lossy, fails = ev.endswith("+loss"), ev.startswith("fail")
                assert old.turn(lossy, fails) == _new_turn(new, lossy, fails), seq
                assert new.doing is WAITING


# a real engine ----------------------------------------------------------------------------------
def _record_transitions(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Doing, Awaits, object]]:
    """Every pump's transitions from now on: (name, doing after, awaits after, what it returned)."""
    seen: list[tuple[str, Doing, Awaits, object]] = []
    for name in ("lost", "take", "settles", "done", "restart"):
        real: Callable[..., object] = getattr(PumpState, name)

        def wrapper(self: PumpState, *args: Any, _real: Callable[..., object] = real, _name: str = name) -> object:
            out = _real(self, *args)
            seen.append((_name, self.doing, self.awaits, out))
            return out

        monkeypatch.setattr(PumpState, name, wrapper)
    return seen


async def test_events_lost_while_the_pump_works_put_settling_off_one_turn_for_their_rescan(
        tmp_path: Path, recorder_cls: Any, start_reloader: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    r = await start_reloader(rec, rescan_interval="0s")
    engine = r.engine
    assert (engine.pump_state.doing, engine.pump_state.awaits) == (WAITING, NOTHING) and not engine.busy
    seen = _record_transitions(monkeypatch)
    real = engine._process
    working: list[bool] = []

    async def losing(events: list[Any]) -> None:  # the first turn loses events while it works (an overflow)
        if not working:
            working.append(engine.busy)
            engine.emit(SourceEvent(EventKind.RESCAN, None, "inotify", lost_at=time.monotonic()))
        await real(events)

    engine._process = losing  # type: ignore[method-assign]
    rescans = engine.stats.rescans
    target = root / "a.conf"
    target.write_text("a")
    await rec.wait_path(target)
    await r.wait_idle(10)
    assert working == [True]
    assert engine.stats.rescans == rescans + 1  # the loss's walk
    at = next(i for i, t in enumerate(seen) if t[0] == "lost")
    assert seen[at - 1][:2] == ("take", WORKING)
    assert seen[at:at + 6] == [
        ("lost", WORKING, LOSS, None),  # in the middle of a turn
        ("settles", WORKING, RESCAN, False),  # that turn puts settling off ...
        ("done", WAITING, RESCAN, None),
        ("take", WORKING, RESCAN, None),  # ... the next takes the loss's rescan in and walks
        ("settles", WORKING, NOTHING, True),  # then settles whatever is due
        ("done", WAITING, NOTHING, None),
    ]
    assert engine.pump_state.doing is WAITING and engine.pump_state.awaits is NOTHING and not engine.busy


async def test_a_periodic_rescan_waiting_for_the_paths_settling_is_seen_in_the_state(
        tmp_path: Path, recorder_cls: Any, start_reloader: Any) -> None:
    root = tmp_path / "root"
    root.mkdir()
    rec = recorder_cls([root])
    r = await start_reloader(rec, rescan_interval="30s", quiet="1s", max_delay="5s")
    engine = r.engine
    st = engine.pump_state
    target = root / "a.conf"
    target.write_text("a")
    await until(lambda: len(engine.agg) > 0, what="the write's event", every=0.005)  # it settles for a second
    before = engine.stats.rescans
    engine.emit(SourceEvent(EventKind.RESCAN, None, "rescan"))  # the timer's tick
    await until(lambda: st.rescan_since is not None, what="the rescan waiting", every=0.005)
    assert engine.stats.rescans == before and not engine.idle  # waiting is not idle
    left = st.rescan_left(time.monotonic(), engine.rescan_wait)
    assert left is not None and 0.0 < left <= 30.0
    await rec.wait_path(target)
    await until(lambda: engine.stats.rescans > before, what="the rescan that waited", timeout=5, every=0.01)
    assert st.rescan_since is None and engine.stats.rescans_waited == 1
    await r.wait_idle(5)
    assert (st.doing, st.awaits, st.held_reads) == (WAITING, NOTHING, 0)
