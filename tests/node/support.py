"""Manifests and waits shared by the node tests and the node benchmark."""

from __future__ import annotations

import json
from typing import Any

from tests.kube.apiserver import KubeCluster
from tests.kube.watch import condition, wait_for

__all__ = ["available", "container_status", "deployment", "ensure_namespace", "running_ready", "wait_pod"]


def deployment(name: str, namespace: str, image: str, *, replicas: int = 1) -> dict[str, Any]:
    """A Deployment of ``image`` as an air-gapped node runs it: ``imagePullPolicy: Never``.

    ``terminationGracePeriodSeconds: 2``: the test images exit on SIGTERM at once, a stuck one must not
    hold a teardown for the default 30 s.
    """
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never"}],
                },
            },
        },
    }


def yaml_of(*objs: dict[str, Any]) -> str:
    """A YAML stream of ``objs`` (JSON is YAML)."""
    return "\n---\n".join(json.dumps(o) for o in objs) + "\n"


def ensure_namespace(kube: KubeCluster, name: str) -> str:
    """Create namespace ``name`` (server-side apply); return the name."""
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}, f"/api/v1/namespaces/{name}")
    return name


def available(d: dict[str, Any]) -> bool:
    """The Deployment's current generation is observed and rolled out with every replica available
    (what ``kubectl rollout status`` waits for)."""
    st, spec = d.get("status") or {}, d.get("spec") or {}
    want = spec.get("replicas", 1)
    return (st.get("observedGeneration", 0) >= d["metadata"].get("generation", 1)
            and st.get("updatedReplicas", 0) == want and st.get("availableReplicas", 0) == want
            and condition(d, "Available") == "True")


def container_status(pod: dict[str, Any]) -> dict[str, Any]:
    """The status of the pod's first container (``{}`` before the kubelet reported one)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return dict(statuses[0])


def running_ready(pod: dict[str, Any]) -> bool:
    """The pod runs and is Ready."""
    return (pod.get("status") or {}).get("phase") == "Running" and condition(pod, "Ready") == "True"


def wait_pod(kube: KubeCluster, namespace: str, app: str, predicate: Any, timeout: float = 90.0) -> dict[str, Any]:
    """The first pod of Deployment ``app`` for which ``predicate`` holds (on the watch)."""
    return wait_for(kube, f"/api/v1/namespaces/{namespace}/pods", predicate, labels=f"app={app}", timeout=timeout)
