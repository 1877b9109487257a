"""examples/kubernetes against a real kube-apiserver: both roles dry-run clean, each shaped as its role needs.

The rights themselves (what each ServiceAccount may and may not do, and the applier running with its own token)
are tests/observability/test_least_privilege.py.
"""

from __future__ import annotations

import asyncio
import json
import tomllib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.kube.apiserver import KubeCluster
from tests.kube_manifests._corpus import Kubectl

from .kube_roles import APPLIER, EXAMPLES, NODE_AGENT, build

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeCluster]:
    """etcd + kube-apiserver v1.20.2 (+ controller-manager), shared by this module's tests."""
    with KubeCluster() as cluster:
        yield cluster


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [obj] = [o for o in objs if o["kind"] == kind]
    return obj


def config_of(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return tomllib.loads(one(objs, "ConfigMap")["data"]["reloadd.toml"])


async def test_both_roles_pass_server_side_dry_run(kube: KubeCluster) -> None:
    # The namespace for real first: a server-side dry run of namespaced objects needs it to exist.
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "reloadd"}}
    await asyncio.to_thread(kube.apply, namespace, "/api/v1/namespaces/reloadd")
    kubectl = Kubectl(kube.kubeconfig, kube.workdir / "kubectl-cache")
    for overlay, workloads in (("node-agent", ["daemonset.apps/reloadd-node"]),
                               ("applier", ["deployment.apps/reloadd-applier"]),
                               ("", ["daemonset.apps/reloadd-node", "deployment.apps/reloadd-applier"])):
        out = await kubectl("apply", "--dry-run=server", "-k", str(EXAMPLES / overlay))
        assert all(w in out for w in workloads) and "(server dry run)" in out, out
        assert "error" not in out.lower(), out
    assert await asyncio.to_thread(kube.get, "/apis/apps/v1/namespaces/reloadd/daemonsets/reloadd-node") is None
    assert await asyncio.to_thread(kube.get, "/apis/apps/v1/namespaces/reloadd/deployments/reloadd-applier") is None


def ids(objs: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return sorted((o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objs)


async def test_the_top_level_kustomization_is_exactly_both_roles(kube: KubeCluster) -> None:
    both, node_agent, applier = [await build(kube, d) for d in ("", "node-agent", "applier")]
    union = {json.dumps(o, sort_keys=True) for o in [*node_agent, *applier]}
    assert sorted(json.dumps(o, sort_keys=True) for o in both) == sorted(union)
    assert len(ids(both)) == len(set(ids(both)))


async def test_node_agent_runs_everywhere_with_no_token_and_no_applier(kube: KubeCluster) -> None:
    objs = await build(kube, "node-agent")
    assert sorted(o["kind"] for o in objs) == ["ConfigMap", "DaemonSet", "Namespace", "ServiceAccount"]
    sa, ds = one(objs, "ServiceAccount"), one(objs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert sa["metadata"]["name"] == pod["serviceAccountName"] == NODE_AGENT
    assert sa["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is False
    assert pod["tolerations"] == [{"operator": "Exists"}]
    cfg = config_of(objs)
    assert sorted(c["plugin"] for c in cfg["consumer"]) == ["containerd-images", "registry-mirrors"]
    c = pod["containers"][0]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert cfg["reloadd"]["metrics_listen"] == "127.0.0.1:9464" and c["livenessProbe"]["httpGet"]["port"] == 9464
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    host = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    for needed in ("/var/lib/reloadd/images", "/var/lib/reloadd/state", "/run/containerd", "/etc/containerd/certs.d"):
        assert needed in mounts and needed in host, needed
    assert "/var/lib/reloadd/manifests" not in mounts | host  # the manifests folder is the applier's alone


async def test_applier_runs_on_control_plane_nodes_only_leader_elected(kube: KubeCluster) -> None:
    node_agent, objs = await build(kube, "node-agent"), await build(kube, "applier")
    deploy = one(objs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == APPLIER and deploy["spec"]["replicas"] >= 2
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]
    tolerated = {t.get("key") for t in pod["tolerations"]}
    assert "node-role.kubernetes.io/control-plane" in tolerated and None not in tolerated  # no blanket toleration
    cfg = config_of(objs)
    [consumer] = cfg["consumer"]
    assert consumer["plugin"] == "kube-manifests" and consumer["options"]["leader_elect"] is True
    # one image for both roles; the two can share a node (ports and state dirs apart)
    image = {one(node_agent, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"],
             pod["containers"][0]["image"]}
    assert len(image) == 1
    assert cfg["reloadd"]["state_dir"] != config_of(node_agent)["reloadd"]["state_dir"]
    assert cfg["reloadd"]["metrics_listen"] != config_of(node_agent)["reloadd"]["metrics_listen"]
