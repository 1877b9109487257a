"""Least privilege of the two roles in examples/kubernetes, enforced by a real kube-apiserver (v1.20.2).

Both overlays are applied for real with kubectl; each test then acts as the role's own ServiceAccount, with a
token the apiserver itself signed (TokenRequest), and the audit log is the server's record of what was asked:

* the node agent is refused reading a Secret, creating a Deployment and patching a ConfigMap, and may do
  nothing else either; running reloadd's images and mirrors consumers with that identity in reach it imports
  an image into a real containerd and writes a hosts.toml without a single API request;
* the applier may do what its folder needs (apply, prune, ApplySet parents, its Lease, Events), and a
  manifest asking for more (a ClusterRole granting ``*``) is refused by the apiserver and reported as such.
"""

from __future__ import annotations

import asyncio
import json
import platform
import subprocess
import tomllib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from reloadd import Reloader, load_config
from reloadd._ops._services import services
from tests.daemon_config import write_config
from tests.infra import ImageSpec, private_containerd, write_oci_archive
from tests.kube.apiserver import KubeCluster
from tests.kube_manifests._corpus import KUBECTL
from tests.waiting import until

from .kube_roles import (
    APPLIER,
    EXAMPLES,
    NODE_AGENT,
    allowed,
    build,
    requests_by,
    sa_token,
    token_kubeconfig,
    username,
)
from .support import sample, scrape

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeCluster]:
    """One apiserver with an audit log and both roles applied for real (``kubectl apply -k``)."""
    with KubeCluster(audit=True) as cluster:
        for overlay in ("node-agent", "applier"):
            subprocess.run([str(KUBECTL), f"--kubeconfig={cluster.kubeconfig}",
                            f"--cache-dir={cluster.workdir / 'kubectl-cache'}", "apply", "-k", str(EXAMPLES / overlay)],
                           check=True, capture_output=True, timeout=120)
        yield cluster


def probe(kube: KubeCluster, token: str) -> dict[str, int]:
    """The three requests root on a worker node would try first, sent with ``token``: their statuses."""
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe", "namespace": "default"}}
    kube.request("POST", "/api/v1/namespaces/default/configmaps", cm)  # exists, as admin: the patch has a target
    deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "evil", "namespace": "default"},
              "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
                  "metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}
    return {
        "read secret": kube.request("GET", "/api/v1/namespaces/kube-system/secrets", token=token)[0],
        "create deployment": kube.request("POST", "/apis/apps/v1/namespaces/default/deployments", deploy,
                                          token=token)[0],
        "patch configmap": kube.request("PATCH", "/api/v1/namespaces/default/configmaps/probe", {"data": {"x": "1"}},
                                        token=token, content_type="application/merge-patch+json")[0],
    }


#: (verb, resource, group, namespace): a sample of writes and Secret reads across the cluster.
WRITES_AND_SECRETS = [
    (verb, res, group, ns)
    for verb in ("create", "update", "patch", "delete")
    for res, group in (("configmaps", ""), ("deployments", "apps"), ("daemonsets", "apps"),
                       ("leases", "coordination.k8s.io"), ("events", ""), ("pods", ""), ("nodes", ""),
                       ("clusterroles", "rbac.authorization.k8s.io"))
    for ns in ("kube-system", "reloadd")
] + [(verb, "secrets", "", ns) for verb in ("get", "list", "watch") for ns in ("kube-system", "reloadd", "default")]


async def test_node_agent_is_refused_secrets_and_every_write(kube: KubeCluster) -> None:
    token = await asyncio.to_thread(sa_token, kube, NODE_AGENT)
    statuses = await asyncio.to_thread(probe, kube, token)
    assert statuses == {"read secret": 403, "create deployment": 403, "patch configmap": 403}
    granted = [a for a in WRITES_AND_SECRETS
               if await asyncio.to_thread(allowed, kube, NODE_AGENT, a[0], a[1], group=a[2], namespace=a[3])]
    assert granted == []
    # and nothing to read either: not even the Lease or the applier's ApplySet parents
    for verb, res, group in (("get", "leases", "coordination.k8s.io"), ("list", "configmaps", ""),
                             ("list", "pods", ""), ("get", "nodes", "")):
        assert not await asyncio.to_thread(allowed, kube, NODE_AGENT, verb, res, group=group, namespace="kube-system")


#: What applying and pruning the applier's folder needs: (verb, resource, group, namespace, name).
APPLIER_NEEDS = [
    *[(verb, "configmaps", "", "kube-system", "") for verb in ("get", "list", "create", "patch", "update", "delete")],
    ("get", "leases", "coordination.k8s.io", "kube-system", "reloadd-manifests"),
    ("update", "leases", "coordination.k8s.io", "kube-system", "reloadd-manifests"),
    ("create", "leases", "coordination.k8s.io", "kube-system", ""),
    ("create", "events", "", "kube-system", ""),
    *[(verb, res, group, "demo-app", "")
      for verb in ("get", "list", "watch", "create", "patch", "delete")
      for res, group in (("configmaps", ""), ("secrets", ""), ("services", ""), ("deployments", "apps"),
                         ("daemonsets", "apps"), ("jobs", "batch"), ("ingresses", "networking.k8s.io"))],
    *[(verb, "namespaces", "", "", "") for verb in ("get", "list", "create", "patch", "delete")],
]

#: Beyond its folder's kinds: RBAC, webhooks, nodes, pods, other Leases, CRD writes.
APPLIER_DENIED = [
    ("create", "clusterroles", "rbac.authorization.k8s.io", "", ""),
    ("create", "rolebindings", "rbac.authorization.k8s.io", "kube-system", ""),
    ("create", "mutatingwebhookconfigurations", "admissionregistration.k8s.io", "", ""),
    ("patch", "nodes", "", "", ""),
    ("create", "pods", "", "demo-app", ""),
    ("update", "leases", "coordination.k8s.io", "kube-system", "kube-scheduler"),
    ("create", "customresourcedefinitions", "apiextensions.k8s.io", "", ""),
    ("impersonate", "users", "", "", ""),
]


async def test_applier_is_allowed_what_its_folder_needs_and_no_more(kube: KubeCluster) -> None:
    missing = [a for a in APPLIER_NEEDS if not await asyncio.to_thread(
        allowed, kube, APPLIER, a[0], a[1], group=a[2], namespace=a[3], name=a[4])]
    assert missing == []
    extra = [a for a in APPLIER_DENIED if await asyncio.to_thread(
        allowed, kube, APPLIER, a[0], a[1], group=a[2], namespace=a[3], name=a[4])]
    assert extra == []
    # The node agent holds none of it.
    assert not any([await asyncio.to_thread(allowed, kube, NODE_AGENT, a[0], a[1], group=a[2], namespace=a[3],
                                            name=a[4]) for a in APPLIER_NEEDS])


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


def role_config(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The role's reloadd.toml, as its ConfigMap ships it."""
    [cm] = [o for o in objs if o["kind"] == "ConfigMap"]
    return tomllib.loads(cm["data"]["reloadd.toml"])


async def test_applier_applies_with_its_own_token_and_a_manifest_asking_more_is_refused(
    kube: KubeCluster, tmp_path: Path
) -> None:
    shipped = role_config(await build(kube, "applier"))
    [consumer] = shipped["consumer"]
    token = await asyncio.to_thread(sa_token, kube, APPLIER)
    kubeconfig = token_kubeconfig(kube, token, tmp_path / "applier.kubeconfig")
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "app.yaml").write_text(APP)
    (manifests / "escalate.yaml").write_text(ESCALATION)
    cfg = load_config(write_config(
        tmp_path / "reloadd.toml",
        {"state_dir": str(tmp_path / "state"), "quiet": "50ms", "metrics_listen": "127.0.0.1:0"},
        [{"name": consumer["name"], "plugin": consumer["plugin"], "paths": [str(manifests)],
          "options": {**consumer["options"], "kubeconfig": str(kubeconfig)}}],
    ))
    r = Reloader(cfg)
    async with services(r) as svc, r:
        base = (svc.metrics_url or "").removesuffix("/metrics")
        deploy = "/apis/apps/v1/namespaces/demo-app/deployments/web"

        async def applied() -> bool:
            return await asyncio.to_thread(kube.get, deploy) is not None

        await until(applied, timeout=60, what="the app applied by the leader with the applier's token")
        assert (await asyncio.to_thread(kube.get, "/api/v1/namespaces/demo-app/configmaps/web-config")) is not None

        async def refused() -> bool:
            rejected = r.status()["consumers"]["manifests"]["rejected"]
            return any(x["path"].endswith("escalate.yaml") for x in rejected)

        await until(refused, timeout=60, what="the ClusterRole refused")
        [err] = [x["error"] for x in r.status()["consumers"]["manifests"]["rejected"]]
        assert "forbidden" in err.lower() and "clusterroles" in err, err
        assert await asyncio.to_thread(kube.get, "/apis/rbac.authorization.k8s.io/v1/clusterroles/everything") is None
        m = await scrape(base)
        assert (sample(m, "reloadd_consumer_stat", consumer="manifests", name="objects_applied") or 0) >= 3
        assert sample(m, "reloadd_consumer_results_total", consumer="manifests", outcome="failure") == 1

        # the server's record: the refusal was the apiserver's (403 to the applier), and the Lease is the shipped one
        mine = requests_by(kube, username(APPLIER))
        assert any((e.get("objectRef") or {}).get("resource") == "clusterroles"
                   and (e.get("responseStatus") or {}).get("code") == 403 for e in mine)
        lease = await asyncio.to_thread(kube.get, "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/"
                                                  "reloadd-manifests")
        assert lease is not None and lease["spec"]["holderIdentity"]
        forbidden = {(e.get("objectRef") or {}).get("resource") for e in mine
                     if (e.get("responseStatus") or {}).get("code") == 403}
        assert forbidden == {"clusterroles"}, forbidden  # everything else it asked for, its RBAC granted

        def failure_event() -> bool:  # the Role's `create events`: the refusal is visible in the cluster too
            events = kube.get("/api/v1/namespaces/kube-system/events")["items"]
            return any(e["reason"] == "ApplyFailed" and "escalate.yaml" in e["message"] for e in events)

        await until(failure_event, thread=True, timeout=30, what="an ApplyFailed Event on the parent")

        (manifests / "app.yaml").unlink()  # prune with the same rights

        async def pruned() -> bool:
            return await asyncio.to_thread(kube.get, deploy) is None

        await until(pruned, timeout=60, what="the app pruned")


@pytest.fixture
async def containerd(tmp_path: Path) -> AsyncIterator[Any]:
    async with private_containerd(tmp_path, hosts_dir=tmp_path / "certs.d", release="1.6") as ctd:
        yield ctd


MIRROR = """[[registry]]
prefix = "registry.reloadd.invalid"
location = "registry.reloadd.invalid"
[[registry.mirror]]
location = "127.0.0.1:5999"
insecure = true
"""


async def test_node_agent_imports_and_mirrors_without_a_single_api_request(
    kube: KubeCluster, containerd: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped node-agent config, its paths moved into tmp_path, against a private containerd.

    The node agent's own token is in reach (``KUBECONFIG``, and the in-cluster variables point at the
    apiserver), as it would be to code that went looking: the audit log shows it was never used.
    """
    shipped = role_config(await build(kube, "node-agent"))
    token = await asyncio.to_thread(sa_token, kube, NODE_AGENT)
    monkeypatch.setenv("KUBECONFIG", str(token_kubeconfig(kube, token, tmp_path / "node.kubeconfig")))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", kube.server.rsplit(":", 1)[1])
    images, conf_d, hosts = tmp_path / "images", tmp_path / "registries.conf.d", tmp_path / "certs.d"
    for d in (images, conf_d, hosts):
        d.mkdir(exist_ok=True)
    moved = {"/var/lib/reloadd/images": images, "/etc/containers/registries.conf.d": conf_d,
             "/etc/containerd/certs.d": hosts, "/run/containerd/containerd.sock": Path(containerd.address),
             "/etc/containerd/config.toml": containerd.config_path}
    consumers = []
    for c in shipped["consumer"]:
        opts = {k: str(moved.get(v, v)) if isinstance(v, str) else v for k, v in c["options"].items()}
        consumers.append({**c, "paths": [str(moved[p]) for p in c["paths"]], "options": opts})
    cfg = load_config(write_config(
        tmp_path / "reloadd.toml", {"state_dir": str(tmp_path / "state"), "quiet": "50ms"}, consumers))
    before = len(requests_by(kube, username(NODE_AGENT)))
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    ref = "registry.reloadd.invalid/library/agent:v1"
    write_oci_archive(images / ".agent.tar.tmp", [ImageSpec(ref, platforms=(f"linux/{arch}",), seed="agent")])
    (images / ".agent.tar.tmp").rename(images / "agent.tar")
    (conf_d / "50-mirror.conf").write_text(MIRROR)
    async with Reloader(cfg) as r:
        async def imported() -> bool:
            return ref in await containerd.ctr("images", "ls", "-q")

        await until(imported, timeout=90, what="the image imported by the node agent")
        hosts_toml = hosts / "registry.reloadd.invalid" / "hosts.toml"
        await until(hosts_toml.exists, timeout=30, what="hosts.toml written by the node agent")
        assert "127.0.0.1:5999" in hosts_toml.read_text()
        await r.wait_idle(15)
        assert all(not s["rejected"] for s in r.status()["consumers"].values()), json.dumps(r.status())[:2000]
    # --audit-log-mode=blocking: every request answered is in the log already.
    assert requests_by(kube, username(NODE_AGENT))[before:] == []
