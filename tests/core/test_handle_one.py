"""The core's per-path fan-out (``BaseConsumer.handle`` over ``handle_one``) and its one error policy."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

import reloadd
from reloadd import (
    Ack,
    BaseConsumer,
    Batch,
    Change,
    ChangeKind,
    PermanentError,
    Reason,
    Reject,
    Result,
    Retry,
    TransientError,
)


class PerFile(BaseConsumer):
    def __init__(self, ctx: reloadd.ConsumerContext, slow: asyncio.Event) -> None:
        super().__init__(ctx)
        self.slow = slow

    async def handle_one(self, change: Change) -> Result:
        name = change.path.name
        if name == "bad":
            raise PermanentError("bad content")
        if name == "busy":
            raise TransientError("server busy")
        if name == "bug":
            raise KeyError("oops")
        if name == "slow":
            await self.slow.wait()
        return Ack({"name": name})


async def test_each_path_settles_alone_and_exceptions_map_one_way(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    slow = asyncio.Event()
    c = PerFile(reloadd.ConsumerContext(name="per", paths=(tmp_path,), options={}, state_dir=tmp_path), slow)
    reported: list[tuple[str, Result]] = []
    four = asyncio.Event()

    def report(p: Path, r: Result) -> None:
        reported.append((p.name, r))
        if len(reported) == 4:
            four.set()

    changes = tuple(Change(tmp_path / n, ChangeKind.ADDED, None) for n in ("ok", "bad", "busy", "bug", "slow"))
    batch = Batch("per", Reason.INOTIFY, changes, reporter=report)
    caplog.set_level(logging.DEBUG, logger="reloadd")
    task = asyncio.create_task(c.handle(batch))
    await asyncio.wait_for(four.wait(), 10)  # the fast paths are reported while "slow" still works
    assert not task.done() and "slow" not in [n for n, _ in reported]
    slow.set()
    results = {p.name: r for p, r in (await task).items()}
    assert results["ok"] == Ack({"name": "ok"}) and results["slow"] == Ack({"name": "slow"})
    assert isinstance(results["bad"], Reject) and results["bad"].error == "bad content"
    assert isinstance(results["busy"], Retry) and results["busy"].error == "server busy"
    assert isinstance(results["bug"], Retry) and "KeyError" in results["bug"].error
    bugs = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(bugs) == 1 and bugs[0].exc_info is not None, "a bug is one ERROR with its traceback"
    assert [n for n, _ in reported][-1] == "slow"


async def test_a_consumer_with_neither_method_says_so(tmp_path: Path) -> None:
    c = BaseConsumer(reloadd.ConsumerContext(name="none", paths=(tmp_path,), options={}, state_dir=tmp_path))
    res = await c.handle(Batch("none", Reason.INOTIFY, (Change(tmp_path / "x", ChangeKind.ADDED, None),)))
    (result,) = res.values()
    assert isinstance(result, Retry) and "implements neither handle() nor handle_one()" in result.error


async def test_the_one_policy_keeps_retry_after_and_retries_deliberate_errors_quietly(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="reloadd")
    busy = reloadd.result_of(TransientError("503", retry_after=7.5), "c", "/x")
    assert busy == Retry("503", after=7.5)
    config = reloadd.result_of(reloadd.ConfigError("kubeconfig: no current-context"), "c", "/x")
    assert config == Retry("kubeconfig: no current-context")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "a deliberate error is no bug"
    assert reloadd.result_of(PermanentError("bad"), "c", "/x") == Reject("bad")


async def test_each_one_after_another_runs_in_order_and_maps_every_path(tmp_path: Path) -> None:
    """A consumer's own phases (say removals one by one) go through the same fan-out and policy."""
    c = BaseConsumer(reloadd.ConsumerContext(name="seq", paths=(tmp_path,), options={}, state_dir=tmp_path))
    running: list[str] = []
    order: list[str] = []

    async def act(change: Change) -> Result:
        running.append(change.path.name)
        assert len(running) == 1, f"{running} ran at once"
        await asyncio.sleep(0.01)
        order.append(change.path.name)
        running.remove(change.path.name)
        if change.path.name == "b":
            raise PermanentError("b is broken")
        return Ack()

    changes = tuple(Change(tmp_path / n, ChangeKind.DELETED, None) for n in ("a", "b", "c"))
    reported: list[str] = []
    batch = Batch("seq", Reason.INOTIFY, changes, reporter=lambda p, r: reported.append(p.name))
    results = await c.each(batch, changes, act, at_once=False)
    assert order == ["a", "b", "c"] and reported == ["a", "b", "c"]
    assert results[tmp_path / "b"] == Reject("b is broken") and results[tmp_path / "c"] == Ack()
