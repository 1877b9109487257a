"""``_pods.pod_problems``: the containers of a failed workload's pods that wait for their image. No cluster: the
pod statuses a kubelet writes (the kubelet end-to-end tests cover the real ones)."""

from __future__ import annotations

from typing import Any

from reloadd_kube_manifests._pods import pod_problems


def pod(name: str, *statuses: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "web"},
            "status": {"phase": "Pending", "containerStatuses": list(statuses),
                       "initContainerStatuses": list(init)}}


def waiting(name: str, reason: str, image: str = "registry.local/web:1.4", message: str = "") -> dict[str, Any]:
    w = {"reason": reason, **({"message": message} if message else {})}
    return {"name": name, "image": image, "state": {"waiting": w}}


def test_image_and_crash_reasons_are_named_with_the_image() -> None:
    pods = {"items": [
        pod("app-1", waiting("app", "ErrImageNeverPull", message='Container image "registry.local/web:1.4" is not '
                                                                 "present with pull policy of Never")),
        pod("app-2", waiting("app", "ContainerCreating")),
        pod("app-3", {"name": "app", "state": {"running": {}}}, init=(waiting("init", "ImagePullBackOff"),)),
        pod("app-4", waiting("app", "CrashLoopBackOff", image="")),
    ]}
    assert pod_problems(pods) == [
        'pod web/app-1: container app waiting ErrImageNeverPull (image registry.local/web:1.4): Container image '
        '"registry.local/web:1.4" is not present with pull policy of Never',
        "pod web/app-3: container init waiting ImagePullBackOff (image registry.local/web:1.4)",
        "pod web/app-4: container app waiting CrashLoopBackOff",
    ]


def test_at_most_three_and_nothing_for_pods_without_statuses() -> None:
    pods = {"items": [pod(f"p{i}", waiting("app", "ErrImagePull")) for i in range(5)]}
    assert len(pod_problems(pods)) == 3
    assert pod_problems({"items": [{"metadata": {"name": "x"}, "status": {"phase": "Pending"}}]}) == []
    assert pod_problems({}) == []
