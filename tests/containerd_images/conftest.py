"""Fixtures for the containerd-images tests: a private containerd of each release, and a consumer bound to it.

Every test that uses ``ctd`` runs once per containerd release nodes run today (1.6, 1.7, 2.x;
``RELOADD_CONTAINERD_RELEASES`` narrows it). At teardown the daemon's log must show no panic:
a request of ours that crashes containerd fails the test even when our side saw only an error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.containerd_images._helpers import Harness
from tests.infra import Containerd, private_containerd, releases_under_test


@pytest.fixture(params=releases_under_test())
def containerd_release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def ctd(tmp_path: Path, containerd_release: str) -> AsyncIterator[Containerd]:
    async with private_containerd(tmp_path, release=containerd_release) as c:
        yield c
        panics = c.panics()
    assert not panics, f"containerd {containerd_release} panicked:\n" + "\n".join(panics[:20])


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
