"""Reloader lifecycle: thread-safe trigger(), clear errors on misuse, SIGHUP chained and restored."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from reloadd import Reloader

from ..conftest import config_for

pytestmark = pytest.mark.timeout(60)


async def test_trigger_from_another_thread_wakes_the_loop(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "root"
    root.mkdir()
    target = root / "a.conf"
    target.write_text("a")
    rec = recorder_cls([root])
    r = await start_reloader(rec, rescan_interval="0s")
    assert len(rec.changes_for(target)) == 1
    loop = asyncio.get_running_loop()
    errors: list[BaseException] = []

    def other_thread() -> None:
        try:
            r.trigger([target])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    loop.set_debug(True)  # asyncio then refuses non-thread-safe calls from other threads
    try:
        t = threading.Thread(target=other_thread)
        t.start()
        await asyncio.to_thread(t.join)
        assert errors == []
        await rec.wait_path(target, 2, timeout=5)
    finally:
        loop.set_debug(False)
    assert rec.changes_for(target)[-1].forced


async def test_trigger_before_start_and_after_close_raises(tmp_path, recorder_cls):
    root = tmp_path / "root"
    root.mkdir()
    r = Reloader(config_for(tmp_path), consumers=[recorder_cls([root])])
    with pytest.raises(RuntimeError, match="before the Reloader started"):
        r.trigger()
    async with r:
        await r.wait_idle(10)
        r.trigger()
    with pytest.raises(RuntimeError, match="closed"):
        r.trigger()
    with pytest.raises(RuntimeError, match="closed"):
        async with r:
            pass
    with pytest.raises(RuntimeError, match="closed"):
        await r.serve()


async def test_sighup_chains_to_the_hosts_handler(tmp_path, recorder_cls):
    seen: list[int] = []
    old = signal.signal(signal.SIGHUP, lambda signum, frame: seen.append(signum))
    try:
        root = tmp_path / "root"
        root.mkdir()
        (root / "a.conf").write_text("a")
        rec = recorder_cls([root])
        async with Reloader(config_for(tmp_path), consumers=[rec], install_signal_handlers=True) as r:
            await r.wait_idle(10)
            os.kill(os.getpid(), signal.SIGHUP)
            await rec.wait_path(root / "a.conf", 2)
            assert seen == [signal.SIGHUP]  # the host still sees its signal
            assert rec.changes_for(root / "a.conf")[-1].forced
    finally:
        signal.signal(signal.SIGHUP, old)


async def test_handler_installed_meanwhile_is_not_overwritten(tmp_path, recorder_cls):
    def before(signum, frame):
        pass

    def theirs(signum, frame):
        pass

    old = signal.signal(signal.SIGHUP, before)
    try:
        root = tmp_path / "root"
        root.mkdir()
        async with Reloader(config_for(tmp_path), consumers=[recorder_cls([root])],
                            install_signal_handlers=True) as r:
            await r.wait_idle(10)
            signal.signal(signal.SIGHUP, theirs)  # the app re-registers its own handler
        assert signal.getsignal(signal.SIGHUP) is theirs
    finally:
        signal.signal(signal.SIGHUP, old)


def test_sighup_chains_and_restores_under_uvloop(tmp_path, recorder_cls):
    import uvloop  # a dev dependency: missing it is an error, not a skip
    # Start from the default disposition whatever the test runner inherited (nohup leaves SIG_IGN):
    # loop.remove_signal_handler() always resets to SIG_DFL, so that is what "restored" means here.
    inherited = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    before = signal.getsignal(signal.SIGHUP)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        host = asyncio.Event()
        loop.add_signal_handler(signal.SIGHUP, host.set)
        try:
            root = tmp_path / "root"
            root.mkdir()
            (root / "a.conf").write_text("a")
            rec = recorder_cls([root])
            async with Reloader(config_for(tmp_path), consumers=[rec], install_signal_handlers=True) as r:
                await r.wait_idle(10)
                os.kill(os.getpid(), signal.SIGHUP)
                await rec.wait_path(root / "a.conf", 2)
                await asyncio.wait_for(host.wait(), 5)  # chained to the host's loop handler
            host.clear()
            os.kill(os.getpid(), signal.SIGHUP)  # after close: the host's handler alone
            await asyncio.wait_for(host.wait(), 5)
            await asyncio.sleep(0.2)
            assert len(rec.changes_for(root / "a.conf")) == 2
        finally:
            loop.remove_signal_handler(signal.SIGHUP)

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(asyncio.wait_for(main(), 30))
        assert signal.getsignal(signal.SIGHUP) == before
    finally:
        signal.signal(signal.SIGHUP, inherited)
