"""Fixtures for the kube-manifests tests: one real control plane per session, a consumer harness per test."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from .support import Harness, KubeCluster

_ids = itertools.count(1)


@pytest.fixture
async def make_harness(
    kube: KubeCluster, tmp_path: Path
) -> AsyncIterator[Any]:
    """Factory: ``make_harness(**options)`` → a started :class:`Harness` on a fresh manifests dir.

    ``move_grace`` defaults to 0 here: a harness hands over one batch and checks its results, while a removal
    inside the move grace answers ``Retry`` until the engine hands the path over again. The grace itself is
    tested with the real engine (``test_km_moves.py``); pass ``move_grace`` to test it with the harness.
    """
    made: list[Harness] = []

    async def make(kubeconfig: Path | None = None, **options: Any) -> Harness:
        n = next(_ids)
        root = tmp_path / f"manifests{n}"
        root.mkdir()
        opts = {"kubeconfig": str(kubeconfig or kube.kubeconfig), "move_grace": "0s", **options}
        h = Harness(kube, root, f"km{n}-{tmp_path.name[-20:].lower().replace('_', '-')}", opts)
        await h.consumer.start()
        made.append(h)
        return h

    yield make
    for h in made:
        await h.consumer.close()


@pytest.fixture
def namespace(kube: KubeCluster, request: pytest.FixtureRequest) -> str:
    """A fresh namespace for the test's objects."""
    test_name: str = request.node.name
    name = f"t{next(_ids)}-" + test_name.lower().replace("_", "-")[:40].strip("-")
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
               f"/api/v1/namespaces/{name}")
    return name
