"""Guarded objects: the kube-watch source puts back what kubectl deletes or edits, and only that.

The real engine and plugin against the real kube-apiserver v1.20.2; the edits are made with the real
kubectl (Debian's v1.20.2), as an operator makes them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from reloadd_kube_manifests import KubeClient
from reloadd_kube_manifests._applyset import LABEL_PART_OF, ObjRef
from reloadd_kube_manifests._discovery import Discovery
from reloadd_kube_manifests._kubeconfig import load_cluster_config
from reloadd_kube_manifests._ledger import Ledger
from reloadd_kube_manifests._watch import list_members

import reloadd
from reloadd._ops._terminal import format_status
from reloadd._pipeline._plan import plan
from tests.waiting import until

from ._corpus import Kubectl
from .support import KubeCluster, cm

pytestmark = pytest.mark.timeout(180)


def write(path: Path, objs: list[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n---\n".join(json.dumps(o) for o in objs))
    tmp.rename(path)


def config(tmp_path: Path, manifests: Path, kubeconfig: Path, **consumer: Any) -> reloadd.Config:
    return reloadd.parse_config({
        "reloadd": {"state_dir": str(tmp_path / "state"), "quiet": "50ms"},
        "consumer": [{
            "name": "manifests", "plugin": "kube-manifests", "paths": [str(manifests)],
            "options": {"kubeconfig": str(kubeconfig), "move_grace": "0s"}, **consumer,
        }],
    })


@pytest.fixture
async def kubectl(kube: KubeCluster, tmp_path: Path) -> AsyncIterator[Kubectl]:
    yield Kubectl(kube.kubeconfig, tmp_path / "kubectl-cache")


def applies(r: reloadd.Reloader) -> float:
    return r.snapshot().consumers[0].stats["files_applied"]


def drift_entries(r: reloadd.Reloader) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = r.status()["consumers"]["manifests"]["drift"]
    return entries


async def test_deleted_and_edited_members_come_back_and_other_managers_fields_stay(
        kube: KubeCluster, kubectl: Kubectl, tmp_path: Path, namespace: str) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    write(manifests / "a.yaml", [cm("guard-a", namespace, v="1")])
    write(manifests / "b.yaml", [cm("guard-b", namespace, v="1")])
    write(manifests / "c.yaml", [cm("guard-c", namespace, v="1")])
    path = f"/api/v1/namespaces/{namespace}/configmaps/"
    async with reloadd.Reloader(config(tmp_path, manifests, kube.kubeconfig)) as r:
        await r.wait_idle(60)
        uid = kube.get(path + "guard-a")["metadata"]["uid"]

        await kubectl("delete", "configmap", "guard-a", "-n", namespace)
        took = await until(lambda: (kube.get(path + "guard-a") or {}).get("data") == {"v": "1"},
                           what="the deleted member recreated", timeout=10)
        assert took <= 3.0, f"recreated after {took:.1f}s"
        assert kube.get(path + "guard-a")["metadata"]["uid"] != uid

        await kubectl("patch", "configmap", "guard-b", "-n", namespace, "--type=merge", "-p", '{"data":{"v":"x"}}')
        took = await until(lambda: kube.get(path + "guard-b")["data"] == {"v": "1"},
                           what="the patched field reverted", timeout=10)
        assert took <= 3.0, f"reverted after {took:.1f}s"

        await r.wait_idle(30)
        before = applies(r)
        await kubectl("label", "configmap", "guard-c", "-n", namespace, "team=ops")
        await kubectl("annotate", "configmap", "guard-c", "-n", namespace, "note=mine")
        await asyncio.sleep(10)  # nothing to wait for: the assertion is that nothing happens
        obj = kube.get(path + "guard-c")
        assert obj["metadata"]["labels"]["team"] == "ops" and obj["metadata"]["annotations"]["note"] == "mine"
        assert applies(r) == before, "a field reloadd does not own was treated as drift"

        entries = {e["what"]: e for e in drift_entries(r)}
        assert set(entries) == {f"ConfigMap {namespace}/guard-a", f"ConfigMap {namespace}/guard-b"}, entries
        assert entries[f"ConfigMap {namespace}/guard-b"]["by"].startswith("kubectl-patch"), entries
        assert all(e["restored"] for e in entries.values()), entries
        assert r.snapshot().consumers[0].drift_total == {"object": 2}


async def test_a_file_edit_is_not_drift_and_pruned_objects_stay_pruned(
        kube: KubeCluster, tmp_path: Path, namespace: str) -> None:
    """reloadd's own writes (an apply that changes fields, a prune) are never reported as drift."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    a = manifests / "a.yaml"
    write(a, [cm("own-a", namespace, v="1"), cm("own-b", namespace, v="1")])
    path = f"/api/v1/namespaces/{namespace}/configmaps/"
    async with reloadd.Reloader(config(tmp_path, manifests, kube.kubeconfig)) as r:
        await r.wait_idle(60)
        for v in range(2, 6):
            write(a, [cm("own-a", namespace, v=str(v), extra=str(v))])
            await until(lambda v=v: kube.get(path + "own-a")["data"]["v"] == str(v),
                        what="the edit applied", timeout=10)
            await r.wait_idle(30)
        await asyncio.sleep(2)  # nothing to wait for: no drift may follow reloadd's own writes
        await r.wait_idle(30)
        assert kube.get(path + "own-b") is None, "the pruned object came back"
        assert drift_entries(r) == [] and r.snapshot().consumers[0].drift_total == {}


async def test_detect_reports_without_changing_and_off_does_nothing(
        kube: KubeCluster, kubectl: Kubectl, tmp_path: Path, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps/"
    for mode in ("detect", "off"):
        manifests = tmp_path / f"manifests-{mode}"
        manifests.mkdir()
        name = f"mode-{mode}"
        write(manifests / "a.yaml", [cm(name, namespace, v="1")])
        cfg = config(tmp_path / mode, manifests, kube.kubeconfig, drift=mode)
        async with reloadd.Reloader(cfg) as r:
            await r.wait_idle(60)
            await kubectl("patch", "configmap", name, "-n", namespace, "--type=merge", "-p", '{"data":{"v":"x"}}')
            if mode == "detect":
                await until(lambda r=r: bool(drift_entries(r)), what="the drift listed", timeout=10)
            await asyncio.sleep(3)  # nothing to wait for: the assertion is that nothing is changed
            await r.wait_idle(30)
            assert kube.get(path + name)["data"] == {"v": "x"}, f"drift = {mode} changed the object"
            entries = drift_entries(r)
            if mode == "off":
                assert entries == [] and r.snapshot().consumers[0].drift_total == {}
                continue
            assert len(entries) == 1 and not entries[0]["restored"], entries
            assert entries[0]["what"] == f"ConfigMap {namespace}/{name}" and "data.v" in entries[0]["why"], entries
            assert entries[0]["by"].startswith("kubectl-patch"), entries
            assert r.snapshot().consumers[0].drifted == 1
            events = kube.get("/api/v1/namespaces/kube-system/events")["items"]
            drifted = [e for e in events if e["reason"] == "Drifted" and name in e["message"]]
            assert drifted and drifted[0]["type"] == "Warning", [e["reason"] for e in events]
            report = await plan(cfg)
            (planned,) = [c for cs in report.consumers[0].changes.values() for c in cs]
            assert planned.action == "drift" and planned.target == f"ConfigMap {namespace}/{name}", planned
            assert report.exit_code == 2 and "DRIFT object" in report.text()


async def test_a_fight_is_backed_off_and_named(kube: KubeCluster, tmp_path: Path, namespace: str) -> None:
    """Another manager reverting an owned field every 100 ms for 60 s: a dozen re-applies at most."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    write(manifests / "a.yaml", [cm("fought", namespace, v="1")])
    path = f"/api/v1/namespaces/{namespace}/configmaps/fought"
    async with reloadd.Reloader(config(tmp_path, manifests, kube.kubeconfig)) as r:
        await r.wait_idle(60)
        before = applies(r)

        def revert() -> None:
            status, body = kube.request("PATCH", path + "?fieldManager=fighter", {"data": {"v": "theirs"}},
                                        content_type="application/merge-patch+json")
            assert status == 200, body

        end = time.monotonic() + 60
        while time.monotonic() < end:
            await asyncio.to_thread(revert)
            await asyncio.sleep(0.1)
        reapplied = applies(r) - before
        assert 2 <= reapplied <= 12, f"{reapplied} re-applies in 60 s of fighting"
        (entry,) = drift_entries(r)
        assert entry["fighting"] and entry["by"].startswith("fighter"), entry
        assert "FIGHTING fighter" in format_status(r.status()), format_status(r.status())


async def test_drift_made_while_the_apiserver_restarts_is_corrected(tmp_path: Path) -> None:
    """The watches end with the apiserver; resumed from a resourceVersion the new one no longer has (410),
    they list again, and that list finds what was deleted or edited meanwhile."""
    from tests.kube.apiserver import kube_cluster

    async with kube_cluster(controllers=()) as kube:
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "restart"}},
                   "/api/v1/namespaces/restart")
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        write(manifests / "a.yaml", [cm("gone", "restart", v="1"), cm("edited", "restart", v="1")])
        path = "/api/v1/namespaces/restart/configmaps/"
        async with reloadd.Reloader(config(tmp_path, manifests, kube.kubeconfig)) as r:
            await r.wait_idle(60)
            await asyncio.sleep(1)  # nothing to wait for: let the watches start before the restart
            # Blocking calls on purpose: the loop (and so reloadd) sees nothing until the drift is made.
            for i in range(5):  # writes the watches do not see: their resourceVersion falls behind
                kube.apply(cm(f"other{i}", "default", v="1"), f"/api/v1/namespaces/default/configmaps/other{i}")
            kube.restart_apiserver()
            assert kube.request("DELETE", path + "gone")[0] == 200
            status, body = kube.request("PATCH", path + "edited?fieldManager=offline-edit", {"data": {"v": "x"}},
                                        content_type="application/merge-patch+json")
            assert status == 200, body
            await until(lambda: (kube.get(path + "gone") or {}).get("data") == {"v": "1"}
                             and kube.get(path + "edited")["data"] == {"v": "1"},
                        what="the drift corrected", timeout=30)
            stats = r.snapshot().consumers[0].stats
            assert stats["watch_relists"] >= 1, stats


async def test_a_member_applied_while_its_list_was_on_its_way_is_not_taken_for_deleted(
        kube: KubeCluster, namespace: str) -> None:
    """The first pass: a watch's list of a kind is taken, a file's apply of an object of that kind answers and the
    ledger takes it in, then the list's answer arrives. The list cannot show the object (it was taken before);
    the watch from the list's resourceVersion brings its ADDED. Judged deleted, the file was applied a second
    time ("Drift ... deleted ... correcting it", seen in the folder benchmark). A member applied before the list
    and missing from it is still deleted."""
    client = KubeClient(load_cluster_config(kube.kubeconfig, None), user_agent="test")
    ledger = Ledger("reloadd")
    discovery = Discovery(client)
    await discovery.load()
    resource = await discovery.resolve("v1", "ConfigMap")
    assert resource is not None

    def apply(name: str) -> dict[str, Any]:
        body = cm(name, namespace, a="1")
        body["metadata"]["labels"] = {LABEL_PART_OF: "set-1"}
        answer: dict[str, Any] = kube.apply(body, f"/api/v1/namespaces/{namespace}/configmaps/{name}",
                                            manager="reloadd")
        return answer

    gone = apply("gone")
    ledger.applied(Path("/m/a.yaml"), "set-1", {ObjRef("", "ConfigMap", namespace, "gone"): gone})
    kube.request("DELETE", f"/api/v1/namespaces/{namespace}/configmaps/gone")

    class ListBeforeTheApply(KubeClient):
        async def get(self, path: str, params: Any = None, *, attempts: int | None = None) -> Any:
            listed = await super().get(path, params, attempts=attempts)
            late = apply("late")  # answered while the list was on its way back
            ledger.applied(Path("/m/b.yaml"), "set-1", {ObjRef("", "ConfigMap", namespace, "late"): late})
            return listed

    racing = ListBeforeTheApply(client.config, user_agent="test")
    judged: list[tuple[str, str]] = []
    try:
        rv = await list_members(racing, resource, "", "ConfigMap", namespace, ledger,
                                lambda kind, ref, _obj: judged.append((kind, ref.name)))
        assert judged == [("DELETED", "gone")]
        assert int(rv) < int(ledger.members[ObjRef("", "ConfigMap", namespace, "late")].rv or 0)
        judged.clear()  # the next list shows it
        await list_members(client, resource, "", "ConfigMap", namespace, ledger,
                           lambda kind, ref, _obj: judged.append((kind, ref.name)))
        assert sorted(judged) == [("DELETED", "gone"), ("MODIFIED", "late")]
    finally:
        await racing.close()
        await client.close()
