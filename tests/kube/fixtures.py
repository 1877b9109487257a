"""The pytest fixtures for a real control plane and a real node, shared by every test directory that needs one.

Import them into a ``conftest.py`` (``from tests.kube.fixtures import kube``), or register them once for the
whole suite with ``pytest_plugins = ["tests.kube.fixtures"]`` in the root conftest so all test
directories share one control plane per session (startup costs ~7 s and ~400 MB).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .apiserver import KubeCluster
from .node import KubeNode, kube_with_node

__all__ = ["kube", "kube_node"]


@pytest.fixture(scope="session")
def kube() -> Iterator[KubeCluster]:
    """A real etcd + kube-apiserver v1.20.2 + kube-controller-manager, shared by the whole session."""
    with KubeCluster() as cluster:
        yield cluster
        cluster.assert_running()  # a component that died mid-session fails the last test loudly


@pytest.fixture(scope="session")
def kube_node() -> Iterator[KubeNode]:
    """A real node, shared by the whole session: its pods run.

    Its own control plane (``kube_node.cluster``: etcd, kube-apiserver, kube-controller-manager with the
    deployment, replicaset and nodelifecycle controllers, kube-scheduler), a private containerd 1.6
    (``kube_node.address``, images in namespace ``k8s.io``) and a kubelet v1.20.2 registered as
    ``node1`` and Ready; the kubelet starts beside the control plane (``kube_with_node``). The shared
    ``kube`` stays without a node, so the pods of other tests' Deployments never run. After the session
    nothing of the node is left on the machine. How to use it: docs/testbed.md.
    """
    with kube_with_node() as node:
        yield node
        node.assert_running()
        node.cluster.assert_running()
    left = node.leftovers()
    assert left == [], f"the test node left these on the machine: {left}"
