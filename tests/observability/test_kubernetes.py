"""examples/kubernetes against a real kube-apiserver: server-side dry run, and the RBAC is enough (and no more)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from reloadd import Reloader, load_config
from reloadd._services import services
from tests.daemon_config import write_config
from tests.kube.apiserver import KubeCluster
from tests.kube_manifests._corpus import Kubectl
from tests.waiting import until

from .support import sample, scrape

pytestmark = pytest.mark.timeout(240)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
TEST_GROUP = "reloadd:restricted"  # the cluster's token-authenticated user without any RBAC

_PLURAL = {"Namespace": "namespaces", "ServiceAccount": "serviceaccounts", "ConfigMap": "configmaps",
           "DaemonSet": "daemonsets", "Role": "roles", "RoleBinding": "rolebindings",
           "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings"}


def load_examples() -> list[dict[str, Any]]:
    """Every object of the kustomization, in its resource order."""
    kust = yaml.safe_load((EXAMPLES / "kustomization.yaml").read_text())
    objs: list[dict[str, Any]] = []
    for name in kust["resources"]:
        objs += [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    return objs


def url(obj: dict[str, Any]) -> str:
    api = obj["apiVersion"]
    base = f"/api/{api}" if "/" not in api else f"/apis/{api}"
    ns = obj["metadata"].get("namespace")
    return f"{base}/{f'namespaces/{ns}/' if ns else ''}{_PLURAL[obj['kind']]}/{obj['metadata']['name']}"


def apply(kube: KubeCluster, obj: dict[str, Any], *, dry_run: bool) -> tuple[int, Any]:
    q = "?fieldManager=reloadd-test&force=true" + ("&dryRun=All" if dry_run else "")
    return kube.request("PATCH", url(obj) + q, obj, content_type="application/apply-patch+yaml")


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeCluster]:
    """etcd + kube-apiserver v1.20.2 (+ controller-manager), shared by this module's tests."""
    with KubeCluster() as cluster:
        yield cluster


async def test_manifests_pass_server_side_dry_run(kube: KubeCluster) -> None:
    objs = load_examples()
    assert [o["kind"] for o in objs].count("DaemonSet") == 1
    [ns] = [o for o in objs if o["kind"] == "Namespace"]
    status, body = await asyncio.to_thread(apply, kube, ns, dry_run=False)  # dry run needs the namespace
    assert status in (200, 201), body
    for obj in objs:
        status, body = await asyncio.to_thread(apply, kube, obj, dry_run=True)
        assert status in (200, 201), f"{obj['kind']} {obj['metadata']['name']}: {status} {body}"
    ds = next(o for o in objs if o["kind"] == "DaemonSet")
    assert await asyncio.to_thread(kube.get, url(ds)) is None  # a dry run persists nothing

    # As an operator runs it: the whole kustomization through kubectl (Debian's v1.20.2), server-side dry run.
    kubectl = Kubectl(kube.kubeconfig, kube.workdir / "kubectl-cache")
    out = await kubectl("apply", "--dry-run=server", "-k", str(EXAMPLES))
    assert "daemonset.apps/reloadd" in out and "(server dry run)" in out, out
    assert await asyncio.to_thread(kube.get, url(ds)) is None

    # the probes point at the endpoints reloadd serves, and the config they use is valid
    pod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    toml = next(o for o in objs if o["kind"] == "ConfigMap")["data"]["reloadd.toml"]
    assert 'metrics_listen = "127.0.0.1:9464"' in toml and c["livenessProbe"]["httpGet"]["port"] == 9464
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    for needed in ("/var/lib/reloadd/images", "/var/lib/reloadd/manifests", "/var/lib/reloadd/state",
                   "/run/containerd", "/etc/containerd/certs.d"):
        assert needed in mounts and needed in host.values(), needed


def grant_test_group(kube: KubeCluster, objs: list[dict[str, Any]]) -> None:
    """Apply the example RBAC for real and bind the same roles to the cluster's restricted user too."""
    for o in objs:
        if o["kind"] in ("Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"):
            status, body = apply(kube, o, dry_run=False)
            assert status in (200, 201), body
    for o in objs:
        if o["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            twin = json.loads(json.dumps(o))
            twin["metadata"]["name"] += "-test-twin"
            twin["subjects"] = [{"kind": "Group", "name": TEST_GROUP, "apiGroup": "rbac.authorization.k8s.io"}]
            status, body = apply(kube, twin, dry_run=False)
            assert status in (200, 201), body


APP = """
apiVersion: v1
kind: Namespace
metadata: {name: demo-app}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: web-config, namespace: demo-app}
data: {greeting: hello}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: demo-app}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: 127.0.0.1:5000/web:v1}]
"""

ESCALATION = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: everything}
rules: [{apiGroups: ["*"], resources: ["*"], verbs: ["*"]}]
"""


async def test_rbac_is_enough_for_the_applier_and_no_more(kube: KubeCluster, tmp_path: Path) -> None:
    await asyncio.to_thread(grant_test_group, kube, load_examples())
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "app.yaml").write_text(APP)
    (manifests / "escalate.yaml").write_text(ESCALATION)
    cfg = load_config(write_config(
        tmp_path / "reloadd.toml",
        {"state_dir": str(tmp_path / "state"), "quiet": "50ms", "metrics_listen": "127.0.0.1:0"},
        [{"name": "manifests", "plugin": "kube-manifests", "paths": [str(manifests)],
          "options": {"kubeconfig": str(kube.restricted_kubeconfig), "namespace": "kube-system"}}],
    ))
    r = Reloader(cfg)
    async with services(r) as svc, r:
        base = (svc.metrics_url or "").removesuffix("/metrics")
        deploy = "/apis/apps/v1/namespaces/demo-app/deployments/web"

        async def applied() -> bool:
            return await asyncio.to_thread(kube.get, deploy) is not None

        await until(applied, timeout=60, what="the app applied with the example RBAC")
        assert (await asyncio.to_thread(kube.get, "/api/v1/namespaces/demo-app/configmaps/web-config")) is not None

        async def refused() -> bool:
            rejected = r.status()["consumers"]["manifests"]["rejected"]
            return any(x["path"].endswith("escalate.yaml") for x in rejected)

        await until(refused, timeout=60, what="the ClusterRole refused")
        [err] = [x["error"] for x in r.status()["consumers"]["manifests"]["rejected"]]
        assert "forbidden" in err.lower()
        assert await asyncio.to_thread(kube.get, "/apis/rbac.authorization.k8s.io/v1/clusterroles/everything") is None
        m = await scrape(base)
        assert (sample(m, "reloadd_consumer_stat", consumer="manifests", name="objects_applied") or 0) >= 3
        assert sample(m, "reloadd_consumer_results_total", consumer="manifests", outcome="failure") == 1

        (manifests / "app.yaml").unlink()  # prune with the same rights

        async def pruned() -> bool:
            return await asyncio.to_thread(kube.get, deploy) is None

        await until(pruned, timeout=60, what="the app pruned")
