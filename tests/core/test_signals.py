"""SIGHUP forces a full resync, bursts are coalesced, and the previous handler comes back."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from reloadd import Reason

pytestmark = pytest.mark.timeout(60)


async def test_sighup_resyncs_every_path_forced(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    for name in ("a.conf", "b.conf"):
        (root / name).write_text(name)
    rec = recorder_cls([root])
    r = await start_reloader(rec, install_signal_handlers=True)
    await rec.wait_for(lambda x: len(x.changes) == 2)
    rec.batches.clear()
    os.kill(os.getpid(), signal.SIGHUP)
    await rec.wait_for(lambda x: len(x.changes) == 2)
    await r.wait_idle(10)
    assert {c.path.name for c in rec.changes} == {"a.conf", "b.conf"}
    assert all(c.forced for c in rec.changes)
    assert all(b.reason is Reason.SIGNAL for b in rec.batches)


async def test_sighup_burst_is_bounded(tmp_path, recorder_cls, start_reloader):
    """A burst of SIGHUPs while the consumer is busy costs one more delivery, not one per signal.

    The count of engine resyncs depends on how the loop interleaves with the burst (the
    kernel already merges pending signals), so the bound is on what the consumer sees.
    """
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.conf").write_text("a")
    rec = recorder_cls([root])
    r = await start_reloader(rec, install_signal_handlers=True)
    await rec.wait_path(root / "a.conf")
    await r.wait_idle(10)
    before = len(rec.changes_for(root / "a.conf"))
    rec.gate = asyncio.Event()
    rec.entered.clear()
    os.kill(os.getpid(), signal.SIGHUP)
    await asyncio.wait_for(rec.entered.wait(), 10)  # the consumer now holds a forced change
    burst = await asyncio.create_subprocess_exec(
        "sh", "-c", f"i=0; while [ $i -lt 1000 ]; do kill -HUP {os.getpid()}; i=$((i+1)); done"
    )
    assert await burst.wait() == 0
    await asyncio.sleep(0.5)
    rec.gate.set()
    await asyncio.sleep(0.2)
    await r.wait_idle(20)
    after = rec.changes_for(root / "a.conf")[before:]
    assert 1 <= r.engine.stats.resyncs
    assert len(after) == 2, [c.forced for c in after]  # the held one + one for the whole burst
    assert all(c.forced for c in after)


async def test_previous_handler_restored(tmp_path, recorder_cls, start_reloader):
    seen = []

    def mine(signum, frame):
        seen.append(signum)

    old = signal.signal(signal.SIGHUP, mine)
    try:
        from reloadd import Reloader

        from ..conftest import config_for

        root = tmp_path / "root"
        root.mkdir()
        async with Reloader(config_for(tmp_path), consumers=[recorder_cls([root])],
                            install_signal_handlers=True) as r:
            await r.wait_idle(10)
            assert signal.getsignal(signal.SIGHUP) is not mine
        assert signal.getsignal(signal.SIGHUP) is mine
        os.kill(os.getpid(), signal.SIGHUP)
        assert seen == [signal.SIGHUP]
    finally:
        signal.signal(signal.SIGHUP, old)


async def test_embedded_reloader_leaves_signals_alone(tmp_path, recorder_cls, start_reloader):
    before = signal.getsignal(signal.SIGHUP)
    root = tmp_path / "root"
    root.mkdir()
    await start_reloader(recorder_cls([root]))
    assert signal.getsignal(signal.SIGHUP) is before


async def test_trigger_forces_one_path(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.conf").write_text("a")
    (root / "b.conf").write_text("b")
    rec = recorder_cls([root])
    r = await start_reloader(rec)
    await rec.wait_for(lambda x: len(x.changes) == 2)
    r.trigger([root / "a.conf"])
    await rec.wait_path(root / "a.conf", 2)
    await r.wait_idle(10)
    assert rec.changes_for(root / "a.conf")[-1].forced
    assert len(rec.changes_for(root / "b.conf")) == 1


async def test_embedders_asyncio_handler_restored(tmp_path, recorder_cls):
    from reloadd import Reloader

    from ..conftest import config_for

    loop = asyncio.get_running_loop()
    seen = asyncio.Event()
    loop.add_signal_handler(signal.SIGHUP, seen.set)
    try:
        root = tmp_path / "root"
        root.mkdir()
        async with Reloader(config_for(tmp_path), consumers=[recorder_cls([root])],
                            install_signal_handlers=True) as r:
            await r.wait_idle(10)
        os.kill(os.getpid(), signal.SIGHUP)
        await asyncio.wait_for(seen.wait(), 5)
    finally:
        loop.remove_signal_handler(signal.SIGHUP)


async def test_a_consumers_own_trigger_says_so_and_sighup_says_signal(tmp_path, recorder_cls, start_reloader):
    """Who asked for a forced pass reaches the consumer: its own ``ctx.trigger`` is not an operator's SIGHUP."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.conf").write_text("a")
    rec = recorder_cls([root], name="rec")
    r = await start_reloader(rec, install_signal_handlers=True)
    await rec.wait_path(root / "a.conf")
    await r.wait_idle(10)
    rec.batches.clear()
    rec.ctx.trigger([root / "a.conf"])
    await rec.wait_for(lambda x: len(x.changes) == 1)
    rec.ctx.trigger(None)  # every path of this consumer
    await rec.wait_for(lambda x: len(x.changes) == 2)
    assert [b.reason for b in rec.batches] == [Reason.TRIGGER, Reason.TRIGGER]
    assert all(c.forced for c in rec.changes)
    await r.wait_idle(10)
    rec.batches.clear()
    os.kill(os.getpid(), signal.SIGHUP)
    await rec.wait_for(lambda x: len(x.changes) == 1)
    assert [b.reason for b in rec.batches] == [Reason.SIGNAL]
