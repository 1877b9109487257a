"""Shared fixtures: a recording consumer and a reloader factory on real inotify in tmp dirs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from reloadd import BaseConsumer, Batch, Change, ConsumerContext, Reloader, Result, parse_config

# One real control plane (etcd + kube-apiserver + controller-manager) per session, for every directory.
pytest_plugins = ["tests.kube.fixtures", "tests.reliability"]


class Recorder(BaseConsumer):
    """A consumer that records every batch and answers with ``results`` (default: Ack)."""

    def __init__(self, roots: list[Path], name: str = "rec", **attrs: Any) -> None:
        super().__init__(ConsumerContext(name=name, paths=tuple(roots), options={}, state_dir=Path("/nonexistent")))
        self.batches: list[Batch] = []
        self.results: Callable[[Change], Result | None] = lambda change: None
        self.gate: asyncio.Event | None = None  # when set, handle() waits for it
        self.entered = asyncio.Event()
        self._cond = asyncio.Condition()
        for k, v in attrs.items():
            setattr(self, k, v)

    async def handle(self, batch: Batch) -> Mapping[Path, Result]:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        async with self._cond:
            self.batches.append(batch)
            self._cond.notify_all()
        out = {}
        for c in batch.changes:
            r = self.results(c)
            if r is not None:
                out[c.path] = r
        return out

    @property
    def changes(self) -> list[Change]:
        return [c for b in self.batches for c in b.changes]

    def changes_for(self, path: Path) -> list[Change]:
        return [c for c in self.changes if c.path == path]

    async def wait_for(self, pred: Callable[[Recorder], bool], timeout: float = 10.0) -> None:
        async def _wait() -> None:
            async with self._cond:
                await self._cond.wait_for(lambda: pred(self))

        await asyncio.wait_for(_wait(), timeout)

    async def wait_path(self, path: Path, count: int = 1, timeout: float = 10.0) -> None:
        await self.wait_for(lambda r: len(r.changes_for(path)) >= count, timeout)


@pytest.fixture
def recorder_cls() -> type[Recorder]:
    return Recorder


def config_for(tmp_path: Path, **settings: Any) -> Any:
    reloadd = {"state_dir": str(tmp_path / "state"), "quiet": "100ms", "max_delay": "2s"}
    reloadd.update(settings)
    return parse_config({"reloadd": reloadd})


@pytest.fixture
async def start_reloader(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """``await start_reloader(consumer, **settings)`` -> a started Reloader, closed at teardown."""
    async with contextlib.AsyncExitStack() as stack:

        async def _start(*consumers: BaseConsumer, **kw: Any) -> Reloader:
            signals = kw.pop("install_signal_handlers", False)
            sources = kw.pop("sources", None)
            r = Reloader(config_for(tmp_path, **kw), consumers=list(consumers),
                         install_signal_handlers=signals, sources=sources)
            await stack.enter_async_context(r)
            await r.wait_idle(10)
            return r

        yield _start
