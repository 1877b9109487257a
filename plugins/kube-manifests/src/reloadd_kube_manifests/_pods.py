"""Why a failed workload's pods do not start: the image a container waits for, read once at failure time.

kstatus judges a Deployment by its counts and conditions; ``ProgressDeadlineExceeded`` says it did not
progress, not why. When a workload's file fails (a deadline, ``HealthTimeout``), the consumer lists the
workload's pods once (one request, by its ``spec.selector.matchLabels``; no watch, no polling) and names a
container that waits for its image (``ErrImageNeverPull``, ``ImagePullBackOff``, ``ErrImagePull``...) or
crash-loops, so the failure reads ``... ; pod web/app-5d-x: container app waiting ErrImageNeverPull (image
registry.local/web:1.4): ...``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reloadd import ReloaddError

from ._applyset import ObjRef
from ._client import KubeClient

__all__ = ["IMAGE_REASONS", "WORKLOADS", "pod_problems", "why_pods_wait"]

IMAGE_REASONS = frozenset({"ErrImageNeverPull", "ImagePullBackOff", "ErrImagePull", "InvalidImageName",
                           "ImageInspectError", "RegistryUnavailable"})
"""Waiting reasons that mean the image is not there (the kubelet's)."""
_OTHER_REASONS = frozenset({"CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError"})
WORKLOADS = {("apps", "Deployment"): "deployments", ("apps", "StatefulSet"): "statefulsets",
             ("apps", "DaemonSet"): "daemonsets", ("apps", "ReplicaSet"): "replicasets", ("batch", "Job"): "jobs"}
"""Kinds whose pods are worth a look (group, kind) → resource."""
_MAX = 3


def pod_problems(pods: Mapping[str, Any]) -> list[str]:
    """What keeps the containers of a pod list from running, one line per waiting container (3 at most)."""
    out: list[str] = []
    for pod in pods.get("items") or ():
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        statuses = [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]
        for cs in statuses:
            waiting = ((cs.get("state") or {}).get("waiting") or {})
            reason = str(waiting.get("reason") or "")
            if reason in IMAGE_REASONS or reason in _OTHER_REASONS:
                image = f" (image {cs['image']})" if cs.get("image") else ""
                message = f": {waiting['message']}" if waiting.get("message") else ""
                out.append(f"pod {meta.get('namespace')}/{meta.get('name')}: container {cs.get('name')} waiting "
                           f"{reason}{image}{message}")
                if len(out) >= _MAX:
                    return out
    return out


async def why_pods_wait(client: KubeClient, ref: ObjRef) -> list[str]:
    """:func:`pod_problems` of the pods of workload ``ref`` (two requests; nothing for other kinds or errors)."""
    resource = WORKLOADS.get((ref.group, ref.kind))
    if resource is None or not ref.namespace:
        return []
    api = f"/apis/{ref.group}/v1/namespaces/{ref.namespace}"
    try:
        obj = await client.get(f"{api}/{resource}/{ref.name}")
        labels = (((obj or {}).get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        if not labels:
            return []
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        pods = await client.get(f"/api/v1/namespaces/{ref.namespace}/pods", {"labelSelector": selector})
    except ReloaddError:
        return []  # an explanation only: the failure stands without it
    return pod_problems(pods or {})
