"""The ApplySet parents as the applier knows them (``_parents``), against a real kube-apiserver.

An apply sends no GET on its parent and writes it once when the widening already says everything; a
parent another writer changed (or made, or deleted) since it was known is read again, so pruning acts on
what the server holds, never on a stale copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from reloadd_kube_manifests import LABEL_PART_OF, KubeClient, applyset_id
from reloadd_kube_manifests._applyset import parent_name

from reloadd import Ack

from .support import Harness, KubeCluster, cm

pytestmark = pytest.mark.timeout(120)

PARENTS = "/api/v1/namespaces/kube-system/configmaps"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """(method, path) of every request the consumers' clients send (they still go to the server)."""
    log: list[tuple[str, str]] = []
    real = KubeClient.request

    async def recording(self: KubeClient, method: str, path: str, **kw: Any) -> Any:
        log.append((method, path))
        return await real(self, method, path, **kw)

    monkeypatch.setattr(KubeClient, "request", recording)
    yield log


def on_parent(sent: list[tuple[str, str]], name: str) -> list[str]:
    """The methods sent on parent ``name`` (its URL, or the collection for a create)."""
    return [m for m, p in sent if p == f"{PARENTS}/{name}" or (m == "POST" and p == PARENTS)]


def stray(kube: KubeCluster, namespace: str, set_id: str) -> str:
    """A ConfigMap labelled into ``set_id`` that no file declares; its URL."""
    path = f"/api/v1/namespaces/{namespace}/configmaps/stray"
    body = cm("stray", namespace, k="x")
    body["metadata"]["labels"] = {LABEL_PART_OF: set_id}
    kube.apply(body, path)
    return path


def claim_stray(kube: KubeCluster, name: str, namespace: str, base: dict[str, Any] | None) -> None:
    """Another reloadd (same field manager) records ``stray`` in parent ``name``, as if it had applied it."""
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": name, "namespace": "kube-system"}, "data": {}}
    if base is not None:
        body["metadata"]["labels"] = base["metadata"]["labels"]
        body["metadata"]["annotations"] = base["metadata"]["annotations"]
        body["data"] = dict(base["data"])
    body["data"]["inventory"] = body["data"].get("inventory", "") + f"/ConfigMap/{namespace}/stray\n"
    body["data"]["namespaces"] = namespace
    kube.apply(body, f"{PARENTS}/{name}", manager="reloadd")


async def test_a_new_file_writes_its_parent_once_and_reads_it_never(
    make_harness: Any, namespace: str, sent: list[tuple[str, str]]
) -> None:
    h: Harness = await make_harness()
    f = h.write("app.yaml", [cm("one", namespace, k="1"), cm("two", namespace, k="2")])
    assert isinstance((await h.sync(f))[f], Ack)
    name = parent_name(h.consumer.key(f))
    assert on_parent(sent, name) == ["POST"]
    sent.clear()
    h.write("app.yaml", [cm("one", namespace, k="1b"), cm("two", namespace, k="2")])
    assert isinstance((await h.sync(f))[f], Ack)
    assert on_parent(sent, name) == ["PATCH"], "the content hash changed: one write, no read"


async def test_a_parent_changed_behind_its_back_is_read_again_before_pruning(
    make_harness: Any, kube: KubeCluster, namespace: str
) -> None:
    h: Harness = await make_harness()
    f = h.write("app.yaml", [cm("one", namespace, k="1")])
    assert isinstance((await h.sync(f))[f], Ack)
    name = parent_name(h.consumer.key(f))
    path = stray(kube, namespace, applyset_id(name, "kube-system"))
    claim_stray(kube, name, namespace, kube.get(f"{PARENTS}/{name}"))
    h.write("app.yaml", [cm("one", namespace, k="2")])
    res = (await h.sync(f))[f]
    assert isinstance(res, Ack), res
    assert kube.get(path) is None, "the object the server's parent recorded was pruned"
    assert "stray" not in kube.get(f"{PARENTS}/{name}")["data"]["inventory"]


async def test_a_parent_made_by_another_writer_after_the_list_is_not_overwritten(
    make_harness: Any, kube: KubeCluster, namespace: str
) -> None:
    h: Harness = await make_harness()
    first = h.write("a.yaml", [cm("a", namespace, k="1")])
    assert isinstance((await h.sync(first))[first], Ack)  # the parents are listed now
    f = h.write("b.yaml", [cm("b", namespace, k="1")])
    name = parent_name(h.consumer.key(f))
    path = stray(kube, namespace, applyset_id(name, "kube-system"))
    claim_stray(kube, name, namespace, None)
    res = (await h.sync(f))[f]
    assert isinstance(res, Ack), res
    assert kube.get(path) is None, "the create failed (AlreadyExists), the parent was read and pruned"


async def test_a_parent_deleted_behind_its_back_is_made_again(
    make_harness: Any, kube: KubeCluster, namespace: str
) -> None:
    h: Harness = await make_harness()
    f = h.write("app.yaml", [cm("one", namespace, k="1"), cm("two", namespace, k="1")])
    assert isinstance((await h.sync(f))[f], Ack)
    name = parent_name(h.consumer.key(f))
    kube.request("DELETE", f"{PARENTS}/{name}")
    h.write("app.yaml", [cm("one", namespace, k="2")])
    res = (await h.sync(f))[f]
    assert isinstance(res, Ack), res
    inventory = kube.get(f"{PARENTS}/{name}")["data"]["inventory"]
    assert inventory == f"/ConfigMap/{namespace}/one\n"
