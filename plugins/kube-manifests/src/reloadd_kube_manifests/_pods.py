"""Why a failed workload's pods do not start: the image a container waits for, read once at failure time.

kstatus judges a Deployment by its counts and conditions; ``ProgressDeadlineExceeded`` says it did not
progress, not why. When a workload's file fails (a deadline, ``HealthTimeout``), the consumer lists the
workload's pods once (one request, by its ``spec.selector.matchLabels``; no watch, no polling) and names a
container that waits for its image (``ErrImageNeverPull``, ``ImagePullBackOff``, ``ErrImagePull``...) or
crash-loops, so the failure reads ``... ; pod web/app-5d-x: container app waiting ErrImageNeverPull (image
registry.local/web:1.4): ...``.

An image that is not there may be one a ``containerd-images`` consumer of the same reloadd provides (a
tarball whose import failed, a list still pulling, an archive refused by ``verify``): the consumer asks
:attr:`reloadd.ConsumerContext.provided` and the line goes on with ``image registry.local/web:1.4 is in
images/web.tar, import failed: ...`` (see :func:`provider_of`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from reloadd import Provision, ProvisionState, ReloaddError

from ._applyset import ObjRef
from ._client import KubeClient

__all__ = ["IMAGE_REASONS", "WORKLOADS", "image_key", "pod_problems", "provider_of", "why_pods_wait"]

IMAGE_REASONS = frozenset({"ErrImageNeverPull", "ImagePullBackOff", "ErrImagePull", "InvalidImageName",
                           "ImageInspectError", "RegistryUnavailable"})
"""Waiting reasons that mean the image is not there (the kubelet's)."""
_OTHER_REASONS = frozenset({"CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError"})
WORKLOADS = {("apps", "Deployment"): "deployments", ("apps", "StatefulSet"): "statefulsets",
             ("apps", "DaemonSet"): "daemonsets", ("apps", "ReplicaSet"): "replicasets", ("batch", "Job"): "jobs"}
"""Kinds whose pods are worth a look (group, kind) → resource."""
_MAX = 3


Explain = Callable[[str], str]
"""What else is known of an image the kubelet cannot find (``""``: nothing)."""


def image_key(ref: str) -> str:
    """An image reference as containerd names it: ``web:1.4`` → ``docker.io/library/web:1.4``, tag
    ``latest`` when none (the kubelet reports the pod spec's spelling, the image store the full one)."""
    name, at, digest = ref.partition("@")
    slash, colon = name.rfind("/"), name.rfind(":")
    name, tag = (name[:colon], name[colon + 1:]) if colon > slash else (name, "latest")
    head, _, tail = name.partition("/")
    if not tail or not ("." in head or ":" in head or head == "localhost"):
        name = f"docker.io/{name if tail else 'library/' + name}"
    elif head == "index.docker.io":
        name = f"docker.io/{tail}"
    return f"{name}{at}{digest}" if at else f"{name}:{tag}"


def provider_of(image: str, provisions: Iterable[Provision]) -> str:
    """The line naming the file that provides ``image`` (one not delivered first), or ``""``."""
    key = image_key(image)
    found = sorted((p for p in provisions if image_key(p.name) == key),
                   key=lambda p: (p.state is ProvisionState.DELIVERED, str(p.path)))
    return found[0].line() if found else ""


def pod_problems(pods: Mapping[str, Any], explain: Explain = lambda image: "") -> list[str]:
    """What keeps the containers of a pod list from running, one line per waiting container (3 at most);
    ``explain`` adds what is known of an image that is not there."""
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
                known = explain(str(cs["image"])) if reason in IMAGE_REASONS and cs.get("image") else ""
                out.append(f"pod {meta.get('namespace')}/{meta.get('name')}: container {cs.get('name')} waiting "
                           f"{reason}{image}{message}" + (f"; {known}" if known else ""))
                if len(out) >= _MAX:
                    return out
    return out


async def why_pods_wait(client: KubeClient, ref: ObjRef, explain: Explain = lambda image: "") -> list[str]:
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
    return pod_problems(pods or {}, explain)
