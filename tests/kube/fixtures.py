"""The pytest fixture for a real control plane, shared by every test directory that needs one.

Import it into a ``conftest.py`` (``from tests.kube.fixtures import kube``), or register it once for the
whole suite with ``pytest_plugins = ["tests.kube.fixtures"]`` in the root conftest so all test
directories share one control plane per session (startup costs ~7 s and ~400 MB).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .apiserver import KubeCluster

__all__ = ["kube"]


@pytest.fixture(scope="session")
def kube() -> Iterator[KubeCluster]:
    """A real etcd + kube-apiserver v1.20.2 + kube-controller-manager, shared by the whole session."""
    with KubeCluster() as cluster:
        yield cluster
        cluster.assert_running()  # a component that died mid-session fails the last test loudly
