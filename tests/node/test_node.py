"""The test bed's node itself: registered and Ready on containerd 1.6, and torn down without a trace.

The air-gap flow through reloadd is in ``test_airgap.py``; these tests use the node directly.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.infra import SERVE, ContainerdError, NodeCri, busybox_image, containerd_config, write_oci_archive
from tests.kube.hostclean import processes_under
from tests.kube.node import SANDBOX_IMAGE, KubeNode
from tests.kube.watch import condition

from .support import container_status, deployment, ensure_namespace, running_ready, wait_pod

pytestmark = pytest.mark.timeout(240)


def test_node_is_registered_ready_and_runs_on_the_private_containerd(kube_node: KubeNode) -> None:
    node = kube_node.cluster.get(f"/api/v1/nodes/{kube_node.name}")
    assert condition(node, "Ready") == "True"
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.20.2"
    assert info["containerRuntimeVersion"].startswith("containerd://1.6."), info
    assert not node["spec"].get("unschedulable")


@pytest.mark.parametrize("release", ["1.6", "1.7"])
async def test_a_second_node_killed_mid_run_is_cleaned_up_without_a_trace(
    kube_node: KubeNode, tmp_path: Path, release: str
) -> None:
    """The worst teardown: kubelet and containerd SIGKILLed with a pod running; nothing may stay behind.

    A second node on the session's cluster (its pod is bound to it by name, the scheduler is not asked),
    on containerd 1.6 and on 1.7 (whose CRI still serves the v1alpha2 a 1.20 kubelet speaks; 2.x does not).
    """
    kube = kube_node.cluster
    node = KubeNode(kube, name=f"node-crash-{release.replace('.', '')}", release=release)
    await asyncio.to_thread(node.start)
    try:
        image = "docker.io/crash/teardown:v1"
        write_oci_archive(tmp_path / "img.tar", [busybox_image(image, SERVE)])
        node.ctr("images", "import", str(tmp_path / "img.tar"))
        ns = ensure_namespace(kube, node.name)
        info = kube.get(f"/api/v1/nodes/{node.name}")["status"]["nodeInfo"]
        assert info["containerRuntimeVersion"].startswith(f"containerd://{release}."), info
        dep = deployment("stays", ns, image)
        dep["spec"]["template"]["spec"]["nodeName"] = node.name
        kube.apply(dep, f"/apis/apps/v1/namespaces/{ns}/deployments/stays")
        pod = await asyncio.to_thread(wait_pod, kube, ns, "stays", running_ready)
        assert container_status(pod)["ready"] is True
        containers = set(node.ctr("containers", "ls", "-q").split())
        assert len(processes_under(node.dir, containers)) >= 4  # containerd, kubelet, shim, the container
        node.kill("kubelet")
        node.kill("containerd")
        assert processes_under(node.dir, containers)  # the shim and the container outlive them
    finally:
        await asyncio.to_thread(node.stop)
    assert node.leftovers() == []
    assert processes_under(node.dir, containers) == []
    kube.request("DELETE", f"/api/v1/nodes/{node.name}")


def test_containerd_2_cannot_be_a_1_20_node(tmp_path: Path) -> None:
    with pytest.raises(ContainerdError, match="v1alpha2"):
        containerd_config(tmp_path, tmp_path / "root", tmp_path / "state", str(tmp_path / "sock"), version=3,
                          node=NodeCri(SANDBOX_IMAGE, tmp_path / "cni", tmp_path / "runc"))
