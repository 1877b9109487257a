"""Concurrent batches: a file stuck in retries must not delay the other files of the consumer.

Driven by the real engine (inotify, settle, retries) against the real kube-apiserver. The stuck file holds a
CRD whose kind another CRD already claims: v1.20.2 marks it ``NamesAccepted=False`` and never
``Established``, so every pass of that file waits out ``crd_timeout`` before it is retried.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from reloadd_kube_manifests import LABEL_PART_OF
from reloadd_kube_manifests._outcome import applyset_of

import reloadd
from reloadd import Ack
from tests.waiting import until

from .support import Harness, KubeCluster, cm
from .test_km_faults import cm_path
from .test_km_reloader import write_atomic

pytestmark = pytest.mark.timeout(120)

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def crd(group: str, plural: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "scope": "Namespaced", "names": {"plural": plural, "kind": kind},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
    }


async def test_a_file_stuck_in_retries_does_not_delay_another_files_edit(
    kube: KubeCluster, tmp_path: Path, namespace: str
) -> None:
    group = f"{namespace}.example.com"
    kube.apply(crd(group, "widgets", "Widget"), f"{CRDS}/widgets.{group}")  # owns the kind Widget
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    ok, stuck = manifests / "ok.yaml", manifests / "stuck.yaml"
    write_atomic(ok, [cm("edited", namespace, v="1")])
    write_atomic(stuck, [crd(group, "gadgets", "Widget")])  # kind taken: never Established
    cfg = reloadd.parse_config({
        "reloadd": {"state_dir": str(tmp_path / "state"), "quiet": "50ms", "shutdown_grace": "1s"},
        "consumer": [{
            "name": "manifests", "plugin": "kube-manifests", "paths": [str(manifests)],
            "options": {"kubeconfig": str(kube.kubeconfig), "crd_timeout": "5s"},
        }],
    })
    path = cm_path(namespace, "edited")
    try:
        async with reloadd.Reloader(cfg) as r:
            await until(lambda: (kube.get(path) or {}).get("data") == {"v": "1"}, what="the first apply")
            # Both files came in the start-up batch, which is still waiting for the stuck CRD.
            assert str(stuck) in r.status()["consumers"]["manifests"]["in_flight"]
            started = time.monotonic()
            write_atomic(ok, [cm("edited", namespace, v="2")])
            await until(lambda: kube.get(path)["data"] == {"v": "2"}, what="the edit", timeout=30)
            took = time.monotonic() - started
            assert took < 1.0, f"the edit took {took:.2f}s behind the slow file of its batch"

            def stuck_alone_in_flight() -> bool:
                return bool(r.status()["consumers"]["manifests"]["in_flight"] == [str(stuck)])

            await until(stuck_alone_in_flight, what="the stuck file's retry to start")
            started = time.monotonic()
            write_atomic(ok, [cm("edited", namespace, v="3")])
            await until(lambda: kube.get(path)["data"] == {"v": "3"}, what="the second edit", timeout=30)
            took = time.monotonic() - started
            unresolved = r.status()["consumers"]["manifests"]
            # still being retried: in flight, in backoff, or queued again (a change seen while in flight)
            assert str(stuck) in {*unresolved["in_flight"], *unresolved["pending"]}, (
                f"the stuck file was not stuck: {unresolved}"
            )
            assert took < 1.0, f"the edit took {took:.2f}s behind the stuck file"
    finally:
        for name in (f"gadgets.{group}", f"widgets.{group}"):
            kube.request("DELETE", f"{CRDS}/{name}")


async def test_a_rename_split_over_two_concurrent_batches_never_loses_the_object(
    make_harness: Any, kube: KubeCluster, namespace: str
) -> None:
    h: Harness = await make_harness()
    assert h.consumer.concurrency == 16
    for i in range(4):
        old = h.write(f"before-{i}.yaml", [cm(f"moving-{i}", namespace, v=str(i))])
        assert isinstance((await h.sync(old))[old], Ack)
        new = h.root / f"after-{i}.yaml"
        old.rename(new)
        # The engine may deliver the two halves of the rename in different batches, running at once.
        applied, removed = await asyncio.gather(h.sync(new), h.sync(old))
        new_data = applied[new]
        assert isinstance(new_data, Ack) and isinstance(removed[old], Ack), (applied, removed)
        obj = kube.get(cm_path(namespace, f"moving-{i}"))
        assert obj is not None, f"round {i}: the renamed file's object was deleted"
        assert obj["metadata"]["labels"][LABEL_PART_OF] == applyset_of(new_data.data)
