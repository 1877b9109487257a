"""Fixtures for the containerd-images tests: a private containerd and a consumer bound to it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.containerd_images._helpers import Harness
from tests.infra import Containerd, private_containerd


@pytest.fixture
async def ctd(tmp_path: Path) -> AsyncIterator[Containerd]:
    async with private_containerd(tmp_path) as c:
        yield c


@pytest.fixture
async def harness(ctd: Containerd, tmp_path: Path) -> AsyncIterator[Callable[..., Harness]]:
    made: list[Harness] = []
    root = tmp_path / "images"
    root.mkdir(exist_ok=True)

    def make(**options: Any) -> Harness:
        state = tmp_path / f"state{len(made)}"
        state.mkdir(exist_ok=True)
        h = Harness(ctd, root, state, options)
        made.append(h)
        return h

    yield make
    for h in made:
        await h.consumer.close()
