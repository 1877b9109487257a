"""``_pods.pod_problems``: the containers of a failed workload's pods that wait for their image. No cluster: the
pod statuses a kubelet writes (the kubelet end-to-end tests cover the real ones)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reloadd_kube_manifests._pods import image_key, pod_problems, provider_of

from reloadd import Provision, ProvisionState


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


def test_image_key_names_images_as_containerd_does() -> None:
    assert image_key("web") == "docker.io/library/web:latest"
    assert image_key("team/web:2") == "docker.io/team/web:2"
    assert image_key("registry.local:5000/web") == "registry.local:5000/web:latest"
    assert image_key("localhost/web@sha256:ab") == "localhost/web@sha256:ab"
    assert image_key("index.docker.io/team/web:2") == "docker.io/team/web:2"


def test_a_waiting_image_some_consumer_provides_names_its_file() -> None:
    def entry(name: str, path: str, state: ProvisionState, detail: str) -> Provision:
        return Provision("image", name, Path("/srv") / path, state, detail, path)

    provided = [
        entry("docker.io/library/web:1.4", "images/ok.tar", ProvisionState.DELIVERED, "imported"),
        entry("docker.io/library/web:1.4", "images/web.tar", ProvisionState.FAILED, "import failed: truncated"),
        entry("registry.local/api:2", "images/api.tar", ProvisionState.REFUSED, "refused: REFUSED images/api.tar"),
    ]
    pods = {"items": [pod("a", waiting("app", "ErrImageNeverPull", image="web:1.4")),
                      pod("b", waiting("app", "ImagePullBackOff", image="registry.local/api:2")),
                      pod("c", waiting("app", "ErrImagePull", image="registry.local/other:1"))]}
    lines = pod_problems(pods, lambda image: provider_of(image, provided))
    assert lines[0].endswith("(image web:1.4); image docker.io/library/web:1.4 is in images/web.tar, "
                             "import failed: truncated")  # the file not delivered, before one that was
    assert lines[1].endswith("; image registry.local/api:2 is in images/api.tar, refused: REFUSED images/api.tar")
    assert lines[2].endswith("(image registry.local/other:1)")  # nobody provides it: nothing added
    crashing = {"items": [pod("d", waiting("app", "CrashLoopBackOff", image="registry.local/api:2"))]}
    (line,) = pod_problems(crashing, lambda image: provider_of(image, provided))
    assert line.endswith("waiting CrashLoopBackOff (image registry.local/api:2)")  # not an image problem
