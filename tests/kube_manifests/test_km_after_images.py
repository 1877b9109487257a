"""``after = ["images"]`` at start-up: no manifest is applied before the images folder is imported.

A real containerd and the real kube-apiserver; both folders are full before the reloader
starts, as on a node that boots. Every handle() of both consumers is timed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import reloadd
from tests.infra import ImageSpec, private_containerd, releases_under_test, write_oci_archive

from .support import KubeCluster

pytestmark = pytest.mark.timeout(240)


def _timed(consumer: Any, spans: list[tuple[str, float, float]]) -> None:
    real = consumer.handle

    async def handle(batch: reloadd.Batch) -> Any:
        start = time.monotonic()
        try:
            return await real(batch)
        finally:
            spans.append((batch.consumer, start, time.monotonic()))

    consumer.handle = handle


async def test_startup_applies_manifests_only_after_the_images_are_imported(
    kube: KubeCluster, tmp_path: Path, namespace: str
) -> None:
    images, manifests = tmp_path / "images", tmp_path / "manifests"
    images.mkdir()
    manifests.mkdir()
    for i in range(3):
        write_oci_archive(images / f"app{i}.tar", [ImageSpec(
            f"example.com/startup/app{i}:v1", layers=3, layer_size=4 << 20, seed=f"startup{i}")])
    for i in range(3):
        (manifests / f"cm{i}.yaml").write_text(
            f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app{i}\n  namespace: {namespace}\n"
            f"data:\n  image: example.com/startup/app{i}:v1\n")
    async with private_containerd(tmp_path, release=releases_under_test()[0]) as ctd:
        cfg = reloadd.parse_config({
            "reloadd": {"state_dir": str(tmp_path / "state"), "quiet": "50ms"},
            "consumer": [
                {"name": "images", "plugin": "containerd-images", "paths": [str(images)],
                 "options": {"address": ctd.address, "namespace": "k8s.io"}},
                {"name": "manifests", "plugin": "kube-manifests", "paths": [str(manifests)],
                 "after": ["images"], "options": {"kubeconfig": str(kube.kubeconfig)}},
            ],
        })
        spans: list[tuple[str, float, float]] = []
        async with reloadd.Reloader(cfg) as r:
            # start() queued the start-up pass as its last step; the pump has not run yet.
            for slot in r.engine.slots.values():
                _timed(slot.consumer, spans)
            await r.wait_idle(120)
            assert {n for n, *_ in spans} == {"images", "manifests"}, spans
            last_import = max(end for n, _, end in spans if n == "images")
            first_apply = min(start for n, start, _ in spans if n == "manifests")
            assert first_apply >= last_import, spans
            for i in range(3):
                assert kube.get(f"/api/v1/namespaces/{namespace}/configmaps/app{i}") is not None
            names = await ctd.ctr("images", "ls", "-q")
            assert all(f"example.com/startup/app{i}:v1" in names for i in range(3)), names
        assert ctd.panics() == []
