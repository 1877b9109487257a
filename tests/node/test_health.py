"""Health on a real node: a manifest file is current when its pods are ready, failed when they crash-loop.

The same reloadd as the air-gap tests (images into the node's containerd, manifests ``after`` images), so
the image a pod runs is one reloadd imported, and the health reloadd reports is what the kubelet and the
deployment controller really did, read from the watch reloadd keeps on its objects.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import reloadd
from reloadd._ops._terminal import format_status
from tests.infra import CRASH, SERVE
from tests.kube.node import KubeNode
from tests.waiting import until

from .support import available, ensure_namespace
from .test_airgap import Spans, airgap, drop_app

__all__ = ["airgap"]  # the fixture, shared with the air-gap tests

pytestmark = pytest.mark.timeout(300)


def _file(r: reloadd.Reloader, path: Path) -> dict[str, Any] | None:
    """The file's health entry in status (``None``: current, or not applied yet)."""
    files = r.status()["consumers"]["manifests"]["health"]["files"]
    return next((f for f in files if f["path"] == str(path)), None)


def _to_current(r: reloadd.Reloader) -> int:
    """How many times a file of the manifests consumer reached current (the save-to-current histogram's count)."""
    report = next(c.health for c in r.snapshot().consumers if c.name == "manifests")
    return report.to_current.count if report is not None else 0


def _drop_app(images: Path, manifests: Path, ns: str, app: str, command: tuple[str, ...],
              deadline: int | None = None) -> Path:
    """The air-gap tests' tarball + Deployment, under this module's image names: the manifest's path."""
    drop_app(images, manifests, ns, app, command, repo="health", deadline=deadline)
    return manifests / f"{app}.yaml"


async def test_a_file_is_current_only_once_its_pod_is_ready(
    kube_node: KubeNode, airgap: tuple[reloadd.Reloader, Path, Path, Spans]
) -> None:
    r, images, manifests, _ = airgap
    kube = kube_node.cluster
    ns = ensure_namespace(kube, "health-web")
    counted = _to_current(r)
    path = _drop_app(images, manifests, ns, "web", SERVE)
    seen: list[str] = []

    def is_current() -> bool:
        known = str(path) in r.status()["consumers"]["manifests"].get("known", [str(path)])
        entry = _file(r, path)
        if entry is not None:
            seen.append(entry["state"])
        return known and entry is None and _to_current(r) > counted

    await until(is_current, what="the file current", timeout=120)
    # reloadd said current: the Deployment the kubelet runs is available by then, not merely accepted
    dep = await asyncio.to_thread(kube.get, f"/apis/apps/v1/namespaces/{ns}/deployments/web")
    assert available(dep), dep.get("status")
    assert "progressing" in seen or "applying" in seen, seen  # it was not current the moment it was applied
    assert f"{path}" not in format_status(r.status())


async def test_a_crash_looping_deployment_fails_its_file_with_the_deadline(
    kube_node: KubeNode, airgap: tuple[reloadd.Reloader, Path, Path, Spans]
) -> None:
    r, images, manifests, _ = airgap
    ns = ensure_namespace(kube_node.cluster, "health-crash")
    path = _drop_app(images, manifests, ns, "crash", CRASH, deadline=10)

    await until(lambda: (_file(r, path) or {}).get("state") == "failed", what="the file failed", timeout=120)
    entry = _file(r, path)
    assert entry is not None
    assert (entry["object"], entry["reason"]) == (f"Deployment {ns}/crash", "ProgressDeadlineExceeded"), entry
    assert "has timed out progressing" in entry["message"], entry
    assert f"FAILED     {path}" in format_status(r.status())
