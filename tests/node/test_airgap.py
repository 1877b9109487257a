"""The air-gap flow on a real node: reloadd imports an image tarball and applies the Deployment that uses it.

One reloadd (the ``Reloader``) with the containerd-images consumer on the node's containerd (namespace
``k8s.io``, the one the kubelet's CRI reads) and the kube-manifests consumer ``after`` it on the node's
cluster. The kubelet can pull nothing (``imagePullPolicy: Never``): a pod runs only if reloadd imported
its image. Every wait is on the API server's watch.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import reloadd
from tests.infra import CRASH, SERVE, BuiltImage, busybox_image, write_oci_archive
from tests.kube.node import KubeNode
from tests.kube.watch import wait_for

from .support import available, container_status, deployment, ensure_namespace, running_ready, wait_pod, yaml_of

pytestmark = pytest.mark.timeout(300)


def airgap_config(kube_node: KubeNode, tmp_path: Path, **image_options: Any) -> tuple[reloadd.Config, Path, Path]:
    """The air-gap reloadd: ``images/`` into the node's containerd (``image_options`` added), ``manifests/``
    ``after`` images on the node's cluster; the folders are created."""
    images, manifests = tmp_path / "images", tmp_path / "manifests"
    images.mkdir()
    manifests.mkdir()
    cfg = reloadd.parse_config({
        "reloadd": {"state_dir": str(tmp_path / "state"), "quiet": "100ms"},
        "consumer": [
            {"name": "images", "plugin": "containerd-images", "paths": [str(images)],
             "options": {"address": kube_node.address, "namespace": "k8s.io", **image_options}},
            {"name": "manifests", "plugin": "kube-manifests", "paths": [str(manifests)], "after": ["images"],
             "options": {"kubeconfig": str(kube_node.cluster.kubeconfig)}},
        ],
    })
    return cfg, images, manifests


def _drop(path: Path, write: Any) -> None:
    """Write ``path`` as a tool would: under a temporary name, renamed into the watched folder."""
    tmp = path.parent.parent / f".{path.name}.part"
    write(tmp)
    os.rename(tmp, path)


def drop_app(images: Path, manifests: Path, ns: str, app: str, command: tuple[str, ...], *,
             repo: str = "airgap", deadline: int | None = None) -> BuiltImage:
    """An image tarball ``<app>.tar`` and a Deployment of it ``<app>.yaml``, dropped one right after the other.

    ``repo`` keeps each test module's images apart on the shared node; ``deadline``: the Deployment's
    ``progressDeadlineSeconds``."""
    image = f"docker.io/{repo}/{app}:v1"
    built = busybox_image(image, command)
    _drop(images / f"{app}.tar", lambda p: write_oci_archive(p, [built]))
    dep = deployment(app, ns, image)
    if deadline is not None:
        dep["spec"]["progressDeadlineSeconds"] = deadline
    _drop(manifests / f"{app}.yaml", lambda p: p.write_text(yaml_of(dep)))
    return built


class Spans:
    """When each consumer's ``handle()`` ran (the order of import and apply)."""

    def __init__(self, r: reloadd.Reloader) -> None:
        self.spans: list[tuple[str, float, float]] = []
        for slot in r.engine.slots.values():
            self._wrap(slot.consumer)

    def _wrap(self, consumer: Any) -> None:
        real = consumer.handle

        async def handle(batch: reloadd.Batch) -> Any:
            start = time.monotonic()
            try:
                return await real(batch)
            finally:
                self.spans.append((batch.consumer, start, time.monotonic()))

        consumer.handle = handle


@pytest.fixture
async def airgap(kube_node: KubeNode, tmp_path: Path) -> AsyncIterator[tuple[reloadd.Reloader, Path, Path, Spans]]:
    """A running reloadd watching ``images/`` (into the node's containerd) and ``manifests/`` (after images)."""
    cfg, images, manifests = airgap_config(kube_node, tmp_path)
    async with reloadd.Reloader(cfg) as r:
        await r.wait_idle(60)
        yield r, images, manifests, Spans(r)


async def test_tarball_and_deployment_dropped_together_run_on_the_node(
    kube_node: KubeNode, airgap: tuple[reloadd.Reloader, Path, Path, Spans]
) -> None:
    r, images, manifests, spans = airgap
    kube = kube_node.cluster
    ns = ensure_namespace(kube, "airgap-web")
    built = drop_app(images, manifests, ns, "web", SERVE)

    dep = await asyncio.to_thread(wait_for, kube, f"/apis/apps/v1/namespaces/{ns}/deployments", available,
                                  name="web", timeout=120)
    assert dep["status"]["availableReplicas"] == 1
    pod = await asyncio.to_thread(wait_pod, kube, ns, "web", running_ready)
    assert pod["spec"]["nodeName"] == kube_node.name
    assert pod["status"]["podIP"].startswith("10.88.0.")  # the node's bridge network, not the host's
    status = container_status(pod)
    assert "running" in status["state"] and status["restartCount"] == 0, status
    assert status["image"] == built.spec.name
    # the very image reloadd imported, by the manifest digest it recorded for the name
    assert status["imageID"] == f"docker.io/airgap/web@{built.target.digest}", status
    assert built.spec.name in kube_node.ctr("images", "ls", "-q").split()

    await r.wait_idle(60)
    imports = [end for name, _, end in spans.spans if name == "images"]
    applies = [start for name, start, _ in spans.spans if name == "manifests"]
    assert imports and applies and min(applies) >= max(imports), spans.spans  # `after`: no apply before the import


async def test_deployment_whose_entrypoint_exits_crash_loops(
    kube_node: KubeNode, airgap: tuple[reloadd.Reloader, Path, Path, Spans]
) -> None:
    _, images, manifests, _ = airgap
    kube = kube_node.cluster
    ns = ensure_namespace(kube, "airgap-crash")
    drop_app(images, manifests, ns, "crash", CRASH)

    def crash_looping(pod: dict[str, Any]) -> bool:
        st = container_status(pod)
        waiting = (st.get("state") or {}).get("waiting") or {}
        return waiting.get("reason") == "CrashLoopBackOff" and st.get("restartCount", 0) > 0

    pod = await asyncio.to_thread(wait_pod, kube, ns, "crash", crash_looping, 120)
    st = container_status(pod)
    assert st["lastState"]["terminated"]["exitCode"] == 3, st  # it ran: the entrypoint's own exit code
    assert st["ready"] is False
    dep = kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/crash")
    assert not available(dep)
