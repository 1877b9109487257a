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
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.conf").write_text("a")
    rec = recorder_cls([root])
    r = await start_reloader(rec, install_signal_handlers=True)
    await rec.wait_path(root / "a.conf")
    burst = await asyncio.create_subprocess_exec(
        "sh", "-c", f"i=0; while [ $i -lt 1000 ]; do kill -HUP {os.getpid()}; i=$((i+1)); done"
    )
    assert await burst.wait() == 0
    await asyncio.sleep(0.2)
    await r.wait_idle(20)
    assert 1 <= r.engine.stats.resyncs <= 10
    assert len(rec.changes_for(root / "a.conf")) <= 11


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
