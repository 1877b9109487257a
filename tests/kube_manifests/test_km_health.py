"""Health of what reloadd applied, on a real kube-apiserver + kube-controller-manager (deployment, replicaset
and job controllers; no scheduler, no kubelet: pods stay Pending, which is what a deadline needs).

What the controllers really give without a node: a Deployment of ``replicas: 0`` becomes Available with
``NewReplicaSetAvailable`` (current); one of ``replicas: 1`` and ``progressDeadlineSeconds: 10`` becomes
``ProgressDeadlineExceeded`` (failed); CRDs become Established inside the apiserver.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import reloadd
from reloadd._ops._metrics import ReloaderCollector, render
from reloadd._ops._terminal import format_status
from tests.kube.apiserver import KubeCluster
from tests.planning import run_text_plan
from tests.waiting import until

from .support import cm

pytestmark = pytest.mark.timeout(240)
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def cluster() -> Iterator[KubeCluster]:
    """A control plane of its own: the shared one runs no deployment controller."""
    with KubeCluster(controllers=("namespace", "garbagecollector", "deployment", "replicaset", "job"),
                     audit=True) as c:
        yield c


@pytest.fixture
def ns(cluster: KubeCluster) -> str:
    name = f"health{next(_ids)}"
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}, f"/api/v1/namespaces/{name}")
    return name


def write(path: Path, objs: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n---\n".join(json.dumps(o) for o in objs))
    tmp.rename(path)


def deployment(name: str, ns: str, replicas: int, *, deadline: int | None = None, wave: int | None = None,
               rev: str = "1") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": replicas, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}, "annotations": {"rev": rev}},
                     "spec": {"containers": [{"name": "app", "image": "registry.local/web:1.4"}]}}}
    if deadline is not None:
        spec["progressDeadlineSeconds"] = deadline
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if wave is not None:
        meta["annotations"] = {"reloadd.io/wave": str(wave)}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}


def config(tmp_path: Path, root: Path, kube: KubeCluster, **options: Any) -> reloadd.Config:
    return reloadd.parse_config({
        "reloadd": {"state_dir": str(tmp_path / "state"), "quiet": "50ms"},
        "consumer": [{"name": "manifests", "plugin": "kube-manifests", "paths": [str(root)],
                      "options": {"kubeconfig": str(kube.kubeconfig), "move_grace": "0s", **options}}],
    })


def health(r: reloadd.Reloader) -> dict[str, Any]:
    doc: dict[str, Any] = r.status()["consumers"]["manifests"]["health"]
    return doc


def file_state(r: reloadd.Reloader, path: Path) -> dict[str, Any] | None:
    """The file's entry (``None``: current)."""
    return next((f for f in health(r)["files"] if f["path"] == str(path)), None)


def current(r: reloadd.Reloader, path: Path) -> bool:
    return path.exists() and file_state(r, path) is None and str(path) in r.status()["consumers"]["manifests"].get(
        "known", [str(path)])


def events(kube: KubeCluster, reason: str) -> list[dict[str, Any]]:
    items = (kube.get("/api/v1/namespaces/kube-system/events") or {}).get("items") or []
    return [e for e in items if e.get("reason") == reason]


async def test_deadline_fails_the_file_with_status_event_metric_and_a_fix_recovers_it(
        cluster: KubeCluster, ns: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "manifests"
    web = root / "web.yaml"
    write(web, [deployment("app", ns, 1, deadline=10), cm("conf", ns)])
    caplog.set_level(logging.INFO, logger="reloadd")
    async with reloadd.Reloader(config(tmp_path, root, cluster)) as r:
        await r.wait_idle(60)
        assert (file_state(r, web) or {}).get("state") == "progressing", health(r)
        assert health(r)["settling"]
        await until(lambda: (file_state(r, web) or {}).get("state") == "failed", what="the deadline", timeout=60)
        f = file_state(r, web)
        assert f is not None
        assert f["state"] == "failed", f
        assert (f["object"], f["reason"]) == (f"Deployment {ns}/app", "ProgressDeadlineExceeded"), f
        assert "has timed out progressing" in f["message"], f
        assert f"FAILED     {web}" in format_status(r.status())
        metrics = render(ReloaderCollector(r).collect()).decode()
        assert 'reloadd_objects{consumer="manifests",health="failed"} 1.0' in metrics, metrics
        assert 'reloadd_objects{consumer="manifests",health="current"} 1.0' in metrics, metrics
        await until(lambda: any(str(web) in e["message"] for e in events(cluster, "HealthFailed")),
                    what="the HealthFailed Event", thread=True, timeout=10)
        failed_lines = [x for x in caplog.records if x.levelno == logging.WARNING and "failed" in x.getMessage()
                        and str(web) in x.getMessage()]
        assert len(failed_lines) == 1, [x.getMessage() for x in failed_lines]

        # Fixed: replicas 0 (a generation bump): the old generation's failure is not the new one's health.
        before = r.snapshot().consumers[0].health
        assert before is not None
        write(web, [deployment("app", ns, 0, deadline=10, rev="2"), cm("conf", ns)])
        await until(lambda: file_state(r, web) is None, what="the fixed file current", timeout=60)
        after = r.snapshot().consumers[0].health
        assert after is not None and after.to_current.count == before.to_current.count + 1
        recovered = [x for x in caplog.records if x.levelno == logging.WARNING and "recovered" in x.getMessage()]
        assert len(recovered) == 1, [x.getMessage() for x in recovered]
        await until(lambda: any(str(web) in e["message"] for e in events(cluster, "HealthRecovered")),
                    what="the HealthRecovered Event", thread=True, timeout=10)


async def test_health_timeout_and_fail_fast(cluster: KubeCluster, ns: str, tmp_path: Path) -> None:
    root = tmp_path / "manifests"
    slow, fast = root / "slow.yaml", root / "fast.yaml"
    write(slow, [deployment("slow", ns, 1)])  # default deadline (600 s): progressing for ever here
    async with reloadd.Reloader(config(tmp_path, root, cluster, health_timeout="5s")) as r:
        await r.wait_idle(60)
        t0 = time.monotonic()
        try:
            await until(lambda: (file_state(r, slow) or {}).get("state") == "failed", what="HealthTimeout",
                        timeout=30)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {health(r)}") from None
        assert 3.5 <= time.monotonic() - t0 <= 20
        f = file_state(r, slow)
        assert f is not None and f["reason"] == "HealthTimeout" and f["object"] == f"Deployment {ns}/slow", f
        assert not health(r)["settling"]
    # Fail-fast: one object fails while another is still progressing, well inside health_timeout.
    write(fast, [deployment("doomed", ns, 1, deadline=10), deployment("waiting", ns, 1)])
    async with reloadd.Reloader(config(tmp_path, root, cluster, health_timeout="2m")) as r:
        await r.wait_idle(60)
        t0 = time.monotonic()
        await until(lambda: (file_state(r, fast) or {}).get("state") == "failed", what="fail-fast", timeout=60)
        assert time.monotonic() - t0 < 60
        f = file_state(r, fast)
        assert f is not None and f["reason"] == "ProgressDeadlineExceeded" and f["object"] == f"Deployment {ns}/doomed"


async def test_restarted_mid_rollout_rebuilds_health_from_the_cluster(
        cluster: KubeCluster, ns: str, tmp_path: Path) -> None:
    root = tmp_path / "manifests"
    web = root / "web.yaml"
    write(web, [deployment("rollout", ns, 1, deadline=10)])
    async with reloadd.Reloader(config(tmp_path, root, cluster)) as r:
        await r.wait_idle(60)
        assert (file_state(r, web) or {}).get("state") == "progressing"
    path = f"/apis/apps/v1/namespaces/{ns}/deployments/rollout"

    def exceeded() -> bool:
        conds = ((cluster.get(path) or {}).get("status") or {}).get("conditions") or []
        return any(c.get("reason") == "ProgressDeadlineExceeded" for c in conds)

    await until(exceeded, what="the deadline, while reloadd is down", thread=True, timeout=60)
    async with reloadd.Reloader(config(tmp_path, root, cluster)) as r:
        await r.wait_idle(60)
        await until(lambda: (file_state(r, web) or {}).get("state") == "failed", what="health rebuilt", timeout=30)
        assert (file_state(r, web) or {}).get("reason") == "ProgressDeadlineExceeded"
        assert r.snapshot().consumers[0].stats["files_applied"] == 0  # from the watch's list, not a re-apply


async def test_namespace_and_crd_files_go_first_without_a_404(
        cluster: KubeCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The issue's case, small: files that sort before the Namespace and the CRD they need."""
    root = tmp_path / "manifests"
    n = next(_ids)
    space, group = f"order{n}", f"order{n}.example.com"
    write(root / "zz-ns.yaml", [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": space}}])
    write(root / "zz-crd.yaml", [{
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}])
    for i in range(12):
        write(root / f"a{i:02}-cms.yaml", [cm(f"c{i}-{j}", space) for j in range(5)])
    write(root / "a99-widget.yaml", [{"apiVersion": f"{group}/v1", "kind": "Widget",
                                      "metadata": {"name": "w", "namespace": space}, "spec": {"size": 1}}])
    caplog.set_level(logging.WARNING, logger="reloadd")
    async with reloadd.Reloader(config(tmp_path, root, cluster)) as r:
        await r.wait_idle(60)
        c = r.snapshot().consumers[0]
        assert c.retried == 0 and c.rejected_total == 0, r.status()["consumers"]["manifests"]
        assert c.stats["files_waited_for_provider"] >= 1
        await until(lambda: health(r)["files"] == [], what="every file current", timeout=30)
        assert health(r)["objects"]["current"] == 12 * 5 + 3
    assert not [x.getMessage() for x in caplog.records if x.levelno >= logging.WARNING]
    assert not [e for e in cluster.audit_events()
                if e.get("responseStatus", {}).get("code") == 404
                and e.get("objectRef", {}).get("namespace") == space
                and e.get("verb") == "patch"], "an object was applied before its namespace or kind"


async def test_waves_apply_after_the_earlier_wave_is_current_and_plan_lists_them(
        cluster: KubeCluster, ns: str, tmp_path: Path) -> None:
    root = tmp_path / "manifests"
    first, second = root / "z-first.yaml", root / "a-second.yaml"
    write(first, [deployment("wave0", ns, 0, deadline=30, wave=0)])
    write(second, [{**cm("wave1", ns), "metadata": {"name": "wave1", "namespace": ns,
                                                   "annotations": {"reloadd.io/wave": "1"}}}])
    cfg = config(tmp_path, root, cluster)
    toml = tmp_path / "reloadd.toml"
    toml.write_text(f"""[reloadd]\nstate_dir = "{tmp_path / 'state'}"\n\n[[consumer]]\nname = "manifests"\n"""
                    f"""plugin = "kube-manifests"\npaths = ["{root}"]\n[consumer.options]\n"""
                    f"""kubeconfig = "{cluster.kubeconfig}"\n""")
    _, text = await run_text_plan(toml)
    assert "wave 1 of 0, 1: applied once every object of wave 0 is current" in text, text
    assert "wave 0 of 0, 1: applied first" in text, text
    async with reloadd.Reloader(cfg) as r:
        await r.wait_idle(60)
        await until(lambda: health(r)["files"] == [], what="both waves current", timeout=60)
    audit = cluster.audit_events()
    status_updates = [e["stageTimestamp"] for e in audit if e.get("objectRef", {}).get("resource") == "deployments"
                      and e.get("objectRef", {}).get("name") == "wave0"
                      and e.get("objectRef", {}).get("subresource") == "status"]
    cm_apply = [e["stageTimestamp"] for e in audit if e.get("objectRef", {}).get("resource") == "configmaps"
                and e.get("objectRef", {}).get("name") == "wave1" and e.get("verb") == "patch"
                and "dryRun" not in e.get("requestURI", "")]  # the plan's
    assert status_updates and cm_apply
    assert min(cm_apply) > max(status_updates), (status_updates, cm_apply)


async def test_a_consumer_after_the_manifests_waits_until_their_files_are_current_or_failed(
        cluster: KubeCluster, ns: str, tmp_path: Path) -> None:
    """``after = ["manifests"]``: the exec consumer runs once the Deployment's file failed (its deadline), not
    once it was applied."""
    root, hooks, marker = tmp_path / "manifests", tmp_path / "hooks", tmp_path / "ran"
    web = root / "web.yaml"
    write(web, [deployment("gated", ns, 1, deadline=10)])
    hooks.mkdir()
    (hooks / "hook.txt").write_text("x")
    cfg = reloadd.parse_config({
        "reloadd": {"state_dir": str(tmp_path / "state"), "quiet": "50ms"},
        "consumer": [
            {"name": "manifests", "plugin": "kube-manifests", "paths": [str(root)],
             "options": {"kubeconfig": str(cluster.kubeconfig), "move_grace": "0s"}},
            {"name": "hooks", "plugin": "exec", "paths": [str(hooks)], "after": ["manifests"],
             # Written aside and renamed: the shell's `>` creates the marker empty before `date` writes it.
             "options": {"command": ["sh", "-c", f"date +%s.%N > {marker}.part && mv {marker}.part {marker}"]}},
        ],
    })
    async with reloadd.Reloader(cfg) as r:
        # Under load the deadline may pass before a look sees the file progressing: the order of the two
        # times below is what proves the wait.
        await until(lambda: (file_state(r, web) or {}).get("state") in ("progressing", "failed"), what="applied",
                    timeout=60)
        await until(marker.exists, what="the hook, after the file failed", timeout=60)
        failed = file_state(r, web)
        assert failed is not None and failed["state"] == "failed", failed
        assert float(marker.read_text()) >= failed["since"] - 0.5  # the hook ran after the failure
