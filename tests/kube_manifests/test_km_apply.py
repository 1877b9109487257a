"""Apply, prune, delete, rename, CRDs and .skip against a real kube-apiserver."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import Any

import pytest
from reloadd_kube_manifests import LABEL_ID, LABEL_PART_OF, applyset_id
from reloadd_kube_manifests._outcome import applyset_of

from reloadd import Ack, Retry

from .support import Harness, KubeCluster, cm

pytestmark = pytest.mark.timeout(120)


def acked(results: dict[Any, Any], path: Any) -> dict[str, Any]:
    res = results[path]
    assert isinstance(res, Ack), res
    assert isinstance(res.data, dict)
    return res.data


def cm_path(ns: str, name: str) -> str:
    return f"/api/v1/namespaces/{ns}/configmaps/{name}"


def parent(kube: KubeCluster, data: dict[str, Any]) -> Any:
    ns, name = data["parent"].split("/")
    return kube.get(cm_path(ns, name))


async def wait_gone(kube: KubeCluster, path: str) -> None:
    deadline = time.monotonic() + 30
    while kube.get(path) is not None:
        assert time.monotonic() < deadline, f"{path} still exists"
        await asyncio.sleep(0.2)  # the namespace controller works asynchronously; poll its result


async def test_create_change_and_prune_a_removed_object(make_harness: Any, kube: KubeCluster,
                                                        namespace: str) -> None:
    h: Harness = await make_harness()
    f = h.write("app.yaml", [cm("one", namespace, k="1"), cm("two", namespace, k="2")])
    data = acked(await h.sync(f), f)
    assert data["applied"] == 2
    one = kube.get(cm_path(namespace, "one"))
    assert one["data"] == {"k": "1"}
    set_id = one["metadata"]["labels"][LABEL_PART_OF]
    p = parent(kube, data)
    assert p["metadata"]["labels"][LABEL_ID] == set_id == applyset_id(p["metadata"]["name"], "kube-system")
    ann = p["metadata"]["annotations"]
    assert ann["applyset.kubernetes.io/contains-group-kinds"] == "ConfigMap"
    assert ann["applyset.kubernetes.io/additional-namespaces"] == namespace
    assert ann["applyset.kubernetes.io/tooling"].startswith("reloadd/")
    assert p["data"]["source"] == str(f)
    assert p["data"]["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    assert f"/ConfigMap/{namespace}/two\n" in p["data"]["inventory"]

    h.write("app.yaml", [cm("one", namespace, k="changed")])
    data = acked(await h.sync(f), f)
    assert kube.get(cm_path(namespace, "one"))["data"] == {"k": "changed"}
    assert kube.get(cm_path(namespace, "two")) is None
    assert data["pruned"] == [f"/ConfigMap/{namespace}/two"]
    assert f"/ConfigMap/{namespace}/two" not in parent(kube, data)["data"]["inventory"]


async def test_deleting_the_file_deletes_everything_then_the_parent(make_harness: Any,
                                                                    kube: KubeCluster) -> None:
    h: Harness = await make_harness()
    ns = f"{h.name}-own"
    f = h.write("sub/dir/stack.yml", [
        cm("in-own-ns", ns, a="b"),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": f"{h.name}-role"}, "rules": []},
    ])
    data = acked(await h.sync(f), f)
    assert data["applied"] == 3  # the Namespace went first although it is second in the file
    assert kube.get(cm_path(ns, "in-own-ns")) is not None
    f.unlink()
    data = acked(await h.sync(f), f)
    assert sorted(data["pruned"]) == sorted([
        f"/ConfigMap/{ns}/in-own-ns", f"/Namespace//{ns}",
        f"rbac.authorization.k8s.io/ClusterRole//{h.name}-role",
    ])
    assert parent(kube, data) is None
    assert kube.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{h.name}-role") is None
    await wait_gone(kube, f"/api/v1/namespaces/{ns}")  # finalised by the real namespace controller
    assert f not in h.records


async def test_rename_moves_objects_without_deleting_them(make_harness: Any, kube: KubeCluster,
                                                          namespace: str) -> None:
    h: Harness = await make_harness()
    old = h.write("old-name.yaml", [cm("moved", namespace, v="1")])
    old_data = acked(await h.sync(old), old)
    uid = kube.get(cm_path(namespace, "moved"))["metadata"]["uid"]
    new = h.root / "new_name.YAML"
    old.rename(new)
    results = await h.sync(old, new)
    new_data = acked(results, new)
    acked(results, old)
    obj = kube.get(cm_path(namespace, "moved"))
    assert obj["metadata"]["uid"] == uid, "the object was deleted and re-created"
    assert obj["metadata"]["labels"][LABEL_PART_OF] == applyset_of(new_data) != applyset_of(old_data)
    assert parent(kube, old_data) is None
    assert parent(kube, new_data) is not None


async def test_an_object_claimed_by_another_set_is_never_deleted(make_harness: Any, kube: KubeCluster,
                                                                 namespace: str) -> None:
    h: Harness = await make_harness()
    a = h.write("a.yaml", [cm("shared", namespace, by="a"), cm("only-a", namespace)])
    acked(await h.sync(a), a)
    b = h.write("b.yaml", [cm("shared", namespace, by="b")])
    b_data = acked(await h.sync(b), b)
    a.unlink()
    a_data = acked(await h.sync(a), a)
    assert a_data["pruned"] == [f"/ConfigMap/{namespace}/only-a"]
    shared = kube.get(cm_path(namespace, "shared"))
    assert shared["metadata"]["labels"][LABEL_PART_OF] == applyset_of(b_data)
    # An object with the same name but no reloadd label at all is not touched either.
    kube.apply(cm("foreign", namespace, x="y"), cm_path(namespace, "foreign"))
    c = h.write("c.yaml", [cm("c1", namespace)])
    acked(await h.sync(c), c)
    c.unlink()
    acked(await h.sync(c), c)
    assert kube.get(cm_path(namespace, "foreign")) is not None


def widget_crd(group: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group, "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"spec": {"type": "object", "properties": {
                    "size": {"type": "integer"}}}}}}}],
        },
    }


async def test_crd_and_its_custom_resource_in_one_file_on_the_first_pass(make_harness: Any,
                                                                         kube: KubeCluster,
                                                                         namespace: str) -> None:
    h: Harness = await make_harness()
    group = f"{h.name}.example.com"
    crd = widget_crd(group)
    widget = {"apiVersion": f"{group}/v1", "kind": "Widget",
              "metadata": {"name": "w1", "namespace": namespace}, "spec": {"size": 3}}
    f = h.write("crd.yaml", [widget, crd])  # the CR first: reloadd must reorder
    data = acked(await h.sync(f), f)
    assert data["applied"] == 2
    w = kube.get(f"/apis/{group}/v1/namespaces/{namespace}/widgets/w1")
    assert w["spec"] == {"size": 3}
    ann = parent(kube, data)["metadata"]["annotations"]
    assert ann["applyset.kubernetes.io/contains-group-kinds"] == (
        f"CustomResourceDefinition.apiextensions.k8s.io,Widget.{group}"
    )
    f.unlink()
    data = acked(await h.sync(f), f)
    assert data["pruned"][0] == f"{group}/Widget/{namespace}/w1"  # custom resources go before the CRD


async def test_skip_file_disables_and_reenables_its_manifest(make_harness: Any, kube: KubeCluster,
                                                             namespace: str) -> None:
    h: Harness = await make_harness()
    items = [cm(f"s{i}", namespace) for i in range(2)]
    f = h.write("app.json", json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    acked(await h.sync(f), f)
    assert kube.get(cm_path(namespace, "s1")) is not None
    marker = h.write("app.json.skip", "")
    assert h.consumer.accepts(marker)
    acked(await h.sync(marker), marker)
    assert h.triggered == [f]
    data = acked(await h.sync(f, forced=True), f)
    assert data["skipped"] is True
    assert kube.get(cm_path(namespace, "s0")) is None and kube.get(cm_path(namespace, "s1")) is None
    marker.unlink()
    acked(await h.sync(marker), marker)
    data = acked(await h.sync(f, forced=True), f)
    assert data["applied"] == 2
    assert kube.get(cm_path(namespace, "s1")) is not None


async def test_unchanged_file_is_not_reapplied_but_forced_pass_restores_drift(
    make_harness: Any, kube: KubeCluster, namespace: str
) -> None:
    h: Harness = await make_harness()
    f = h.write("drift.yaml", [cm("d", namespace, key="desired")])
    acked(await h.sync(f), f)
    # Someone edits the object in the cluster (an update, as `kubectl edit` does).
    obj = kube.get(cm_path(namespace, "d"))
    obj["data"]["key"] = "drifted"
    status, _ = kube.request("PUT", cm_path(namespace, "d"), obj)
    assert status == 200
    before = h.consumer.stats["api_requests"]
    acked(await h.sync(f), f)
    assert h.consumer.stats["api_requests"] == before, "an unchanged file was re-applied"
    assert kube.get(cm_path(namespace, "d"))["data"]["key"] == "drifted"
    acked(await h.sync(f, forced=True), f)
    assert kube.get(cm_path(namespace, "d"))["data"]["key"] == "desired"


async def test_accepts_manifests_only_outside_dotfiles(make_harness: Any) -> None:
    h: Harness = await make_harness()
    r = h.root
    assert all(h.consumer.accepts(r / n) for n in ("a.yaml", "b.YML", "c.Json"))
    assert h.consumer.accepts(r / "deep" / "er" / "d.yaml")
    assert not h.consumer.accepts(r / ".hidden.yaml")
    assert not h.consumer.accepts(r / ".git" / "x.yaml")
    assert not h.consumer.accepts(r / "notes.txt")
    assert not h.consumer.accepts(r / "x.txt.skip")
    assert h.consumer.accepts(r / "deep" / "x.yaml.skip")
    assert not h.consumer.accepts(r / "deep" / ".cache" / "x.yaml")
    assert not h.consumer.accepts(r / "x.yaml.")  # no suffix: the name ends in a dot
    assert not h.consumer.accepts(r / ".yaml")  # a dotfile, not a suffix
    # The key names the file by its path under the root, sub-folders included.
    assert h.consumer.key(r / "deep" / "er" / "d.yaml") == f"{h.consumer.name}:deep/er/d.yaml"
    assert h.consumer.key(r / "a.yaml") == f"{h.consumer.name}:a.yaml"


async def test_dry_run_changes_nothing(make_harness: Any, kube: KubeCluster, namespace: str) -> None:
    h: Harness = await make_harness(dry_run=True)
    f = h.write("dry.yaml", [cm("dry", namespace, k="v")])
    data = acked(await h.sync(f), f)
    assert data["applied"] == 1
    assert kube.get(cm_path(namespace, "dry")) is None
    assert parent(kube, data) is None


async def test_prune_off_keeps_objects_that_left_the_file(make_harness: Any, kube: KubeCluster,
                                                          namespace: str) -> None:
    h: Harness = await make_harness(prune=False)
    f = h.write("keep.yaml", [cm("stays", namespace), cm("also-stays", namespace)])
    acked(await h.sync(f), f)
    h.write("keep.yaml", [cm("stays", namespace)])
    acked(await h.sync(f), f)
    f.unlink()
    acked(await h.sync(f), f)
    assert kube.get(cm_path(namespace, "stays")) is not None
    assert kube.get(cm_path(namespace, "also-stays")) is not None


async def test_forced_pass_prunes_by_label_what_the_inventory_missed(make_harness: Any, kube: KubeCluster,
                                                                     namespace: str) -> None:
    h: Harness = await make_harness()
    f = h.write("inv.yaml", [cm("listed", namespace)])
    data = acked(await h.sync(f), f)
    # Another ApplySet-aware tool put an object into this set; only the labels know about it.
    stray = cm("stray", namespace)
    stray["metadata"]["labels"] = {LABEL_PART_OF: applyset_of(data)}
    kube.apply(stray, cm_path(namespace, "stray"), manager="other-tool")
    h.write("inv.yaml", [cm("listed", namespace, v="2")])
    acked(await h.sync(f), f)
    assert kube.get(cm_path(namespace, "stray")) is not None  # the cheap path trusts the inventory
    data = acked(await h.sync(f, forced=True), f)
    assert data["pruned"] == [f"/ConfigMap/{namespace}/stray"]
    assert kube.get(cm_path(namespace, "stray")) is None
    assert kube.get(cm_path(namespace, "listed")) is not None


async def test_resync_interval_asks_for_forced_passes(make_harness: Any) -> None:
    h: Harness = await make_harness(resync_interval="100ms")
    async with asyncio.timeout(10):
        await h.resynced.wait()
    await h.consumer.close()
    assert h.consumer._resync is None


async def test_custom_resource_whose_crd_is_in_another_file_is_retried(make_harness: Any, kube: KubeCluster,
                                                                      namespace: str) -> None:
    h: Harness = await make_harness()
    group = f"{h.name}.example.com"
    cr = h.write("a-cr.yaml", [{"apiVersion": f"{group}/v1", "kind": "Widget",
                                "metadata": {"name": "w", "namespace": namespace}, "spec": {"size": 1}}])
    crd = h.write("b-crd.yaml", [widget_crd(group)])
    first = (await h.sync(cr))[cr]
    assert isinstance(first, Retry) and "unknown kind: Widget is not served" in first.error
    acked(await h.sync(crd), crd)
    acked(await h.sync(cr), cr)  # the engine's retry
    assert kube.get(f"/apis/{group}/v1/namespaces/{namespace}/widgets/w")["spec"] == {"size": 1}
