"""The two roles of examples/kubernetes as a real kube-apiserver sees them: their objects, identities and rights.

* :func:`build` renders an overlay with kubectl's own kustomize (v1.20.2, what an operator runs).
* :func:`sa_token` mints a real ServiceAccount token (TokenRequest, signed by the apiserver's key), so a test
  acts *as* the node agent or the applier, not as a stand-in user bound to the same roles.
* :func:`allowed` asks the apiserver's authorizer (SubjectAccessReview) what an account may do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.kube.apiserver import KubeCluster
from tests.kube_manifests._corpus import Kubectl

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
NAMESPACE = "reloadd"
NODE_AGENT = "reloadd-node"
APPLIER = "reloadd-applier"


def username(account: str) -> str:
    """The user name the apiserver gives ``account``'s tokens (as in the audit log)."""
    return f"system:serviceaccount:{NAMESPACE}:{account}"


async def build(kube: KubeCluster, overlay: str) -> list[dict[str, Any]]:
    """``kubectl kustomize examples/kubernetes/<overlay>``: the objects an operator applies."""
    kubectl = Kubectl(kube.kubeconfig, kube.workdir / "kubectl-cache")
    out = await kubectl("kustomize", str(EXAMPLES / overlay))
    return [d for d in yaml.safe_load_all(out) if d]


def sa_token(kube: KubeCluster, account: str, *, seconds: int = 3600) -> str:
    """A token of ServiceAccount ``reloadd/<account>`` from the TokenRequest API (the account must exist)."""
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": seconds}}
    status, answer = kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token", body)
    assert status == 201, f"TokenRequest for {account}: {status} {answer}"
    return str(answer["status"]["token"])


def token_kubeconfig(kube: KubeCluster, token: str, path: Path) -> Path:
    """A kubeconfig at ``path`` that authenticates with ``token``."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "test", "cluster": {"server": kube.server, "certificate-authority": str(kube.ca_file)}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "test", "user": "sa"}}],
    }))
    return path


def allowed(kube: KubeCluster, account: str, verb: str, resource: str, *, group: str = "",
            namespace: str = "", name: str = "") -> bool:
    """Whether the apiserver's authorizer lets ``reloadd/<account>`` do ``verb`` on ``resource``."""
    attrs = {"verb": verb, "resource": resource, "group": group, "namespace": namespace, "name": name}
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": username(account),
                     "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}",
                                "system:authenticated"],
                     "resourceAttributes": {k: v for k, v in attrs.items() if v}}}
    status, answer = kube.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body)
    assert status == 201, f"SubjectAccessReview: {status} {answer}"
    return bool(answer["status"].get("allowed"))


def requests_by(kube: KubeCluster, user: str) -> list[dict[str, Any]]:
    """Every request the audit log holds from ``user``."""
    return [e for e in kube.audit_events() if (e.get("user") or {}).get("username") == user]
