"""Errors against a real kube-apiserver: conflicts, 422, 403, bombs, huge and malformed files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reloadd import Ack, Reject, Retry

from .support import Harness, KubeCluster, cm

pytestmark = pytest.mark.timeout(120)


def cm_path(ns: str, name: str) -> str:
    return f"/api/v1/namespaces/{ns}/configmaps/{name}"


def rejected(results: dict[Any, Any], path: Any) -> str:
    res = results[path]
    assert isinstance(res, Reject), res
    return res.error


async def test_field_conflict_is_reported_with_force_off_and_taken_over_with_force_on(
    make_harness: Any, kube: KubeCluster, namespace: str
) -> None:
    strict: Harness = await make_harness(force=False)
    f = strict.write("c.yaml", [cm("contested", namespace, key="ours")])
    assert isinstance((await strict.sync(f))[f], Ack)
    kube.apply(cm("contested", namespace, key="theirs"), cm_path(namespace, "contested"), manager="operator")
    strict.write("c.yaml", [cm("contested", namespace, key="ours-v2")])
    error = rejected(await strict.sync(f), f)
    assert "doc 1 (line 1) ConfigMap" in error and "contested" in error
    assert "conflict" in error and ".data.key" in error and '"operator"' in error
    assert "force = true" in error
    assert kube.get(cm_path(namespace, "contested"))["data"]["key"] == "theirs"

    forcing: Harness = await make_harness()  # force defaults to true, like k3s
    g = forcing.write("c.yaml", [cm("contested", namespace, key="ours-v2")])
    assert isinstance((await forcing.sync(g))[g], Ack)
    obj = kube.get(cm_path(namespace, "contested"))
    assert obj["data"]["key"] == "ours-v2"
    owners = {m["manager"] for m in obj["metadata"]["managedFields"] if "f:data" in m.get("fieldsV1", {})}
    assert owners == {"reloadd"}


async def test_invalid_object_is_reported_and_the_rest_of_the_file_applied(
    make_harness: Any, kube: KubeCluster, namespace: str
) -> None:
    h: Harness = await make_harness()
    f = h.write("mixed.yaml", [cm("good", namespace), cm("Bad_Name", namespace)])
    error = rejected(await h.sync(f), f)
    assert "doc 2 (line 3) ConfigMap" in error and "422 Invalid" in error and "Bad_Name" in error
    assert kube.get(cm_path(namespace, "good")) is not None
    assert h.records[f].error == error
    assert h.records[f].data["applied"] == 1
    parent = h.records[f].data["parent"].split("/")[1]
    events = kube.get(f"/api/v1/namespaces/kube-system/events?fieldSelector=involvedObject.name={parent}")
    [event] = events["items"]
    assert (event["type"], event["reason"]) == ("Warning", "ApplyFailed")
    assert "Bad_Name" in event["message"] and str(f) in event["message"]


async def test_unknown_field_500_on_1_20_is_a_permanent_error(make_harness: Any, namespace: str) -> None:
    h: Harness = await make_harness()
    bad = cm("bogus", namespace)
    bad["bogus"] = 1
    f = h.write("bogus.yaml", [bad])
    error = rejected(await h.sync(f), f)
    assert "field not declared in schema" in error


async def test_forbidden_objects_are_reported_with_a_restricted_token(
    make_harness: Any, kube: KubeCluster, namespace: str
) -> None:
    rules = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]
    subject = [{"kind": "Group", "name": kube.restricted_group, "apiGroup": "rbac.authorization.k8s.io"}]
    rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces"
    for ns in (namespace, "kube-system"):
        role = f"{namespace}-cm"
        kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                    "metadata": {"name": role, "namespace": ns}, "rules": rules},
                   f"{rbac}/{ns}/roles/{role}")
        kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                    "metadata": {"name": role, "namespace": ns}, "subjects": subject,
                    "roleRef": {"kind": "Role", "name": role, "apiGroup": "rbac.authorization.k8s.io"}},
                   f"{rbac}/{ns}/rolebindings/{role}")
    h: Harness = await make_harness(kubeconfig=kube.restricted_kubeconfig)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": namespace},
              "stringData": {"a": "b"}}
    f = h.write("rbac.yaml", [cm("allowed", namespace), secret])
    error = rejected(await h.sync(f), f)
    assert "doc 2 (line 3) Secret" in error and "403 Forbidden" in error
    assert 'User "restricted" cannot patch resource "secrets"' in error
    assert kube.get(cm_path(namespace, "allowed")) is not None
    assert kube.get(f"/api/v1/namespaces/{namespace}/secrets/s") is None

    # Without rights on the parent's namespace the whole file is refused up front.
    outsider: Harness = await make_harness(kubeconfig=kube.restricted_kubeconfig, namespace="default")
    g = outsider.write("x.yaml", [cm("never", namespace)])
    error = rejected(await outsider.sync(g), g)
    assert "403 Forbidden" in error and "configmaps" in error
    assert kube.get(cm_path(namespace, "never")) is None


BOMB = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: laughs, namespace: NS}
data:
  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
  b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
  c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
  d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
  e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
  f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
  g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
  h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
  i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


async def test_yaml_bomb_is_rejected_and_its_neighbours_applied(
    make_harness: Any, kube: KubeCluster, namespace: str
) -> None:
    h: Harness = await make_harness()
    good = f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: beside-bomb, namespace: {namespace}}}\n"
    f = h.write("bomb.yaml", good + "---\n" + BOMB.replace("NS", namespace))
    error = rejected(await h.sync(f), f)
    assert "doc 2 (line 5): rejected: expands to more than" in error
    assert kube.get(cm_path(namespace, "laughs")) is None
    assert kube.get(cm_path(namespace, "beside-bomb")) is not None


async def test_twenty_megabyte_manifest_is_rejected_unread(make_harness: Any, kube: KubeCluster,
                                                           namespace: str) -> None:
    h: Harness = await make_harness()
    small = h.write("small.yaml", [cm("small", namespace)])
    assert isinstance((await h.sync(small))[small], Ack)
    big = cm("huge", namespace, blob="x" * (20 * 1024 * 1024))
    f = h.write("huge.json", [big])
    before = h.consumer.stats["api_requests"]
    error = rejected(await h.sync(f), f)
    assert "larger than the 5242880 byte limit" in error
    assert h.consumer.stats["api_requests"] == before, "the API server was contacted"
    assert kube.get(cm_path(namespace, "huge")) is None


async def test_malformed_documents_beside_good_ones_hold_back_pruning(
    make_harness: Any, kube: KubeCluster, namespace: str
) -> None:
    h: Harness = await make_harness()
    f = h.write("edit.yaml", [cm("first", namespace, v="1"), cm("second", namespace, v="1")])
    assert isinstance((await h.sync(f))[f], Ack)
    # The user is half-way through editing the second document.
    h.write("edit.yaml", (
        f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: first, namespace: {namespace}}}\n"
        "data: {v: '2'}\n"
        "---\n"
        f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: second, namespace: {namespace}\n"
        "---\n"
        "just a string\n"
        "---\n"
        f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: third, namespace: {namespace}}}\n"
    ))
    error = rejected(await h.sync(f), f)
    assert "doc 2 (line 6): YAML error" in error
    assert "doc 3 (line 10): expected an object, got str" in error
    assert "pruning held back" in error
    assert kube.get(cm_path(namespace, "first"))["data"] == {"v": "2"}
    assert kube.get(cm_path(namespace, "third")) is not None
    assert kube.get(cm_path(namespace, "second")) is not None, "pruned although its document was broken"
    # Once the file is valid again, pruning resumes.
    h.write("edit.yaml", [cm("first", namespace, v="3")])
    res = (await h.sync(f))[f]
    assert isinstance(res, Ack)
    assert sorted(res.data["pruned"]) == [f"/ConfigMap/{namespace}/second", f"/ConfigMap/{namespace}/third"]


async def test_missing_namespace_and_unknown_kind_are_retried(make_harness: Any, kube: KubeCluster,
                                                              namespace: str) -> None:
    h: Harness = await make_harness()
    f = h.write("later.yaml", [
        cm("waits", f"{h.name}-not-yet"),
        {"apiVersion": "nothing.example.com/v1", "kind": "Gizmo", "metadata": {"name": "g"}},
        cm("fine", namespace),
    ])
    res = (await h.sync(f))[f]
    assert isinstance(res, Retry), res
    assert 'namespaces "' in res.error and "not found" in res.error
    assert "doc 2 (line 3) Gizmo g: unknown kind: Gizmo is not served in nothing.example.com/v1" in res.error
    assert kube.get(cm_path(namespace, "fine")) is not None


async def test_rename_keeps_an_object_that_failed_to_move(make_harness: Any, kube: KubeCluster,
                                                          namespace: str) -> None:
    h: Harness = await make_harness(force=False)
    old = h.write("before.yaml", [cm("sticky", namespace, key="ours"), cm("free", namespace)])
    assert isinstance((await h.sync(old))[old], Ack)
    kube.apply(cm("sticky", namespace, key="theirs"), cm_path(namespace, "sticky"), manager="operator")
    new = h.root / "after.yaml"
    old.rename(new)
    results = await h.sync(old, new)
    assert "conflict" in rejected(results, new)
    assert isinstance(results[old], Ack)
    assert kube.get(cm_path(namespace, "sticky")) is not None, "deleted although the renamed file declares it"
    assert kube.get(cm_path(namespace, "free")) is not None


async def test_a_transient_failure_that_heals_leaves_no_warning_event(
    make_harness: Any, kube: KubeCluster, namespace: str
) -> None:
    """A custom resource handed over before its CRD (another file) is served: Retry, then Ack, and no
    ApplyFailed Event is left behind; a file that keeps failing does get one, on its third try."""
    from .test_km_apply import widget_crd

    h: Harness = await make_harness()
    group = f"heal-{h.name}.example.com"
    cr = h.write("cr.yaml", [{"apiVersion": f"{group}/v1", "kind": "Widget",
                              "metadata": {"name": "w1", "namespace": namespace}, "spec": {"size": 1}}])

    def events_of(path: Path) -> list[dict[str, Any]]:
        items = kube.get("/api/v1/namespaces/kube-system/events")["items"]
        return [e for e in items if e["reason"] == "ApplyFailed" and e["message"].startswith(f"{path}: ")]

    first = (await h.sync(cr))[cr]
    assert isinstance(first, Retry) and "not served" in first.error, first
    crd = h.write("crd.yaml", [widget_crd(group)])
    assert isinstance((await h.sync(crd))[crd], Ack)
    assert isinstance((await h.sync(cr))[cr], Ack)
    assert events_of(cr) == []

    stuck = h.write("stuck.yaml", [{"apiVersion": f"never-{h.name}.example.com/v1", "kind": "Gadget",
                                    "metadata": {"name": "g", "namespace": namespace}}])
    for attempt in (1, 2, 3):
        assert isinstance((await h.sync(stuck))[stuck], Retry)
        assert len(events_of(stuck)) == (1 if attempt == 3 else 0), attempt
