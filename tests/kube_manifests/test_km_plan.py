"""``reloadd plan`` for kube-manifests: server-side dry-run diffs and prunes equal to what the next pass does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ..planning import consumer_doc, planned, real_pass, run_plan, run_text_plan, write_config
from .support import KubeCluster, cm

pytestmark = pytest.mark.timeout(240)


def _write(path: Path, objs: list[dict[str, Any]]) -> None:
    path.write_text("\n---\n".join(json.dumps(o) for o in objs) + "\n")


def _live(kube: KubeCluster, namespace: str) -> dict[str, Any]:
    """The test namespace's ConfigMaps as the pass leaves them, ApplySet parents aside: name → (data, labels)."""
    items = kube.get(f"/api/v1/namespaces/{namespace}/configmaps")["items"]
    return {
        f"ConfigMap {namespace}/{o['metadata']['name']}": (o.get("data"), o["metadata"].get("labels"))
        for o in items
        if o["metadata"]["name"] != "kube-root-ca.crt" and not o["metadata"]["name"].startswith("reloadd-")
    }


def _live_changes(before: dict[str, Any], after: dict[str, Any]) -> set[tuple[str, str]]:
    out = {(t, "create") for t in after.keys() - before.keys()}
    out |= {(t, "prune") for t in before.keys() - after.keys()}
    return out | {(t, "update") for t in before.keys() & after.keys() if before[t] != after[t]}


def _setup(tmp_path: Path, kubeconfig: Path, namespace: str = "default") -> tuple[Path, Path]:
    """An empty manifests folder and a config watching it (no move grace: removals in the same pass).

    The ApplySet parents live in the test's namespace: they are keyed by consumer and file name, so in
    kube-system the ``a.yaml`` of another test (same session, same cluster) would be this one's.
    """
    root = tmp_path / "manifests"
    root.mkdir()
    config = write_config(tmp_path, {
        "name": "manifests", "plugin": "kube-manifests", "paths": [str(root)],
        "options": {"kubeconfig": str(kubeconfig), "move_grace": "0s", "namespace": namespace},
    })
    return root, config


async def _plan_then_pass(config: Path, kube: KubeCluster, namespace: str) -> tuple[set[tuple[str, str, str]], Any]:
    rc, doc, err = await run_plan(config)
    changes = planned(doc, "manifests")
    assert rc == (2 if changes else 0), err
    before = _live(kube, namespace)
    assert _live(kube, namespace) == before, "plan changed the cluster"
    await real_pass(config, timeout=120)
    assert _live_changes(before, _live(kube, namespace)) == {(target, action) for _, action, target in changes}
    rc, again, err = await run_plan(config)
    assert rc == 0, err
    assert consumer_doc(again, "manifests")["status"] == "unchanged"
    return changes, doc


async def test_plan_matches_the_real_pass(kube: KubeCluster, tmp_path: Path, namespace: str) -> None:
    root, config = _setup(tmp_path, kube.kubeconfig, namespace)
    a, b, x, y = (root / n for n in ("a.yaml", "b.yaml", "x.yaml", "y.yaml"))
    _write(a, [cm("a1", namespace, v="1"), cm("a2", namespace, v="1")])
    _write(b, [cm("b1", namespace, v="1")])
    _write(x, [cm("x1", namespace, v="1")])
    (root / "notes.txt").write_text("not a manifest\n")

    def obj(name: str) -> str:
        return f"ConfigMap {namespace}/{name}"

    changes, doc = await _plan_then_pass(config, kube, namespace)
    assert changes == {(str(a), "create", obj("a1")), (str(a), "create", obj("a2")),
                       (str(b), "create", obj("b1")), (str(x), "create", obj("x1"))}

    _write(a, [cm("a1", namespace, v="2"), cm("a3", namespace, v="1")])  # a1 changed, a2 left, a3 new
    b.unlink()  # b1 goes with its file
    x.rename(y)  # x1 moves to y's set: relabelled, not deleted
    rc, text = await run_text_plan(config)
    assert rc == 2
    assert f"  {a}\n    update {obj('a1')}\n" in text and f"prune {obj('b1')}" in text

    changes, doc = await _plan_then_pass(config, kube, namespace)
    assert changes == {
        (str(a), "update", obj("a1")), (str(a), "create", obj("a3")), (str(a), "prune", obj("a2")),
        (str(b), "prune", obj("b1")), (str(y), "update", obj("x1")),
    }
    by_target = {c["target"]: c for cs in consumer_doc(doc, "manifests")["changes"].values() for c in cs}
    diff = by_target[obj("a1")]["diff"]
    assert '-    "v": "1"' in diff and '+    "v": "2"' in diff
    assert "managedFields" not in diff and "resourceVersion" not in diff
    assert "applyset.kubernetes.io/part-of" in by_target[obj("x1")]["diff"]


async def test_unreachable_api_server_exits_1(kube: KubeCluster, tmp_path: Path) -> None:
    dead = tmp_path / "dead.kubeconfig"
    dead.write_text(kube.kubeconfig.read_text().replace(kube.server, "https://127.0.0.1:1"))
    root, config = _setup(tmp_path, dead)
    _write(root / "a.yaml", [cm("a1", "default", v="1")])
    rc, doc, err = await run_plan(config)
    assert rc == 1
    assert consumer_doc(doc, "manifests")["status"] == "error"
    assert "consumer 'manifests': failed to plan:" in err


async def test_skip_marker_plans_the_removal_the_pass_makes(kube: KubeCluster, tmp_path: Path, namespace: str) -> None:
    root, config = _setup(tmp_path, kube.kubeconfig, namespace)
    a = root / "skipped.yaml"
    _write(a, [cm("s1", namespace, v="1"), cm("s2", namespace, v="1")])
    await _plan_then_pass(config, kube, namespace)
    (root / "skipped.yaml.skip").write_text("")
    changes, _ = await _plan_then_pass(config, kube, namespace)
    assert changes == {(str(a), "prune", f"ConfigMap {namespace}/s1"), (str(a), "prune", f"ConfigMap {namespace}/s2")}
    (root / "skipped.yaml.skip").unlink()
    changes, _ = await _plan_then_pass(config, kube, namespace)
    assert {(action, target) for _, action, target in changes} == {
        ("create", f"ConfigMap {namespace}/s1"), ("create", f"ConfigMap {namespace}/s2")}


async def test_a_manifest_the_pass_would_refuse_fails_the_plan_naming_it(
        kube: KubeCluster, tmp_path: Path, namespace: str) -> None:
    root, config = _setup(tmp_path, kube.kubeconfig, namespace)
    _write(root / "good.yaml", [cm("good", namespace, v="1")])
    broken = root / "broken.yaml"
    broken.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: [unclosed\n")
    rc, doc, err = await run_plan(config)
    assert rc == 1, err
    manifests = consumer_doc(doc, "manifests")
    assert manifests["status"] == "invalid"
    (entry,) = manifests["invalid"]
    assert entry["path"] == str(broken) and entry["error"]
    assert any(p == str(root / "good.yaml") for p, _, _ in planned(doc, "manifests")), "the good file is still planned"
