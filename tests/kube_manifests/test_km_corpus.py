"""Real third-party manifests (``corpus/``): reloadd must land exactly what ``kubectl apply --server-side`` does.

The corpus is applied twice to the same real kube-apiserver: first as one startup batch through the
consumer, then, after deleting the files has deleted everything, file by file with kubectl v1.20.2. Every
object is read back after each pass and compared, by content and by the set of fields each side's field
manager owns; each file's ApplySet must hold exactly the objects kubectl found in the file. A dropped
document, a value coerced to another type or a field lost while parsing shows up as a missing object, a
differing value or a differing field set.

Cluster-scoped objects (CRDs, ClusterRoles, ...) cannot be renamed per side, hence one side after the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from reloadd_kube_manifests import LABEL_PART_OF
from reloadd_kube_manifests._outcome import applyset_of

from reloadd import Ack, Reject, Result, Retry

from ._corpus import (
    REFUSED_BY_1_20,
    SSA_PROTOCOL_ERROR,
    Kubectl,
    Locator,
    applied_fields,
    comparable,
    corpus_files,
    creates_prerequisites,
    declares_crds,
    diff,
    ref_of,
    render,
)
from .support import Harness, KubeCluster

pytestmark = pytest.mark.timeout(240)

KUBECTL_MANAGER = "kubectl-corpus"
RELOADD_MANAGER = "reloadd-corpus"
EXPECTED_FILES = 71
EXPECTED_OBJECTS = 132  # what kubectl finds in the corpus; another count means the corpus changed


def kubeconfig_in(kube: KubeCluster, namespace: str, path: Path) -> Path:
    """The admin kubeconfig with ``namespace`` as its default: objects naming none land there, for both."""
    config = json.loads(kube.kubeconfig.read_text())
    for ctx in config["contexts"]:
        ctx["context"]["namespace"] = namespace
    path.write_text(json.dumps(config))
    return path


def refused(rel: str, namespace: str) -> set[str]:
    """The refs the server refuses in ``rel`` (see ``REFUSED_BY_1_20``)."""
    return {ref.format(default=namespace) for ref in REFUSED_BY_1_20.get(rel, ())}


def files_args(root: Path, files: list[str]) -> list[str]:
    return [arg for rel in files for arg in ("-f", str(root / rel))]


async def kubectl_apply(kubectl: Kubectl, root: Path, files: list[str],
                        namespace: str) -> dict[str, list[dict[str, Any]]]:
    """Apply each file with its own ``kubectl apply --server-side``; the objects each file made, as applied."""
    async def one(rel: str) -> tuple[str, list[dict[str, Any]]]:
        path = str(root / rel)
        code, out, err = await kubectl.run("apply", "--server-side", f"--field-manager={KUBECTL_MANAGER}",
                                           "--validate=false", "-f", path, "-o", "json")
        if not refused(rel, namespace):
            assert code == 0, f"kubectl apply {rel}: {err}"
            value = json.loads(out)
            return rel, list(value["items"] if value.get("kind") == "List" else [value])
        assert code != 0 and err.count(SSA_PROTOCOL_ERROR) == len(refused(rel, namespace)), (rel, err)
        return rel, await kubectl.objects("get", "--ignore-not-found", "-f", path)  # kubectl prints none

    first = [rel for rel in files if creates_prerequisites((root / rel).read_bytes())]
    applied = dict(await asyncio.gather(*(one(rel) for rel in first)))  # what the others' objects need
    crds = [rel for rel in first if declares_crds((root / rel).read_bytes())]
    await kubectl("wait", "--for=condition=established", "--timeout=60s", *files_args(root, crds))
    applied.update(await asyncio.gather(*(one(rel) for rel in files if rel not in applied)))
    return applied


def snapshot(kube: KubeCluster, urls: dict[str, str]) -> dict[str, dict[str, Any]]:
    """GET every object; the ones that exist, by ref."""
    found = {ref: kube.get(url) for ref, url in urls.items()}
    return {ref: obj for ref, obj in found.items() if obj is not None}


async def wait_deleted(kube: KubeCluster, urls: dict[str, str], what: str) -> None:
    """Wait until no object is left (namespaces and CRDs are finalised asynchronously)."""
    deadline = time.monotonic() + 90
    left = dict(urls)
    while left := {ref: urls[ref] for ref in snapshot(kube, left)}:
        assert time.monotonic() < deadline, f"{what}: still there: {sorted(left)}"
        await asyncio.sleep(0.5)  # finalizers run in other components; there is no event to await


async def reloadd_apply(h: Harness, paths: list[Path]) -> dict[Path, Result]:
    """Hand every file over in one batch, as at startup; hand those answered Retry over again, as the engine does.

    A file whose custom resources are resolved before another file's CRD is served gets Retry at first.
    """
    results = await h.sync(*paths)
    final = dict(results)
    for _ in range(5):
        again = [p for p, r in results.items() if isinstance(r, Retry)]
        if not again:
            break
        await asyncio.sleep(0.5)  # the engine's retry backoff
        results = await h.sync(*again)
        final.update(results)
    return final


async def test_corpus_lands_as_kubectl_lands_it(make_harness: Any, kube: KubeCluster, namespace: str,
                                                tmp_path: Path) -> None:
    files = corpus_files()
    assert len(files) == EXPECTED_FILES, "the corpus changed: update EXPECTED_FILES and corpus/README.md"
    kubeconfig = kubeconfig_in(kube, namespace, tmp_path / "kubeconfig.json")
    kubectl = Kubectl(kubeconfig, tmp_path / "kubectl-cache")
    # The corpus is removed in one pass on purpose, far over the default max_prune: no hold.
    h: Harness = await make_harness(kubeconfig, namespace=namespace, field_manager=RELOADD_MANAGER, max_prune=0)
    locate = Locator(kube)
    urls: dict[str, str] = {}  # ref → object URL, for everything the corpus declares
    rendered = tmp_path / "rendered"
    for rel in files:
        (rendered / rel).parent.mkdir(parents=True, exist_ok=True)
        (rendered / rel).write_bytes(render(rel))
    kubectl_done = True  # nothing of kubectl's to clean up yet
    try:
        # 1. reloadd, every file in one batch: acked, or refused where the server refuses kubectl too.
        paths = [h.write(rel, render(rel)) for rel in files]
        results = await reloadd_apply(h, paths)
        inventory: dict[str, set[str]] = {}
        set_of: dict[str, str] = {}
        for rel, path in zip(files, paths, strict=True):
            res = results[path]
            if refused(rel, namespace):
                assert isinstance(res, Reject), f"{rel}: {res}"
                for ref in refused(rel, namespace):
                    _, kind, ns, name = ref.split("/")
                    assert f"{kind} {ns}/{name}: " in res.error and SSA_PROTOCOL_ERROR in res.error, res.error
            else:
                assert isinstance(res, Ack), f"{rel}: {res}"
            data = res.data
            assert isinstance(data, dict), f"{rel}: {res}"
            ns, name = data["parent"].split("/")
            parent = kube.get(f"/api/v1/namespaces/{ns}/configmaps/{name}")
            inventory[rel] = set(parent["data"]["inventory"].splitlines())
            assert data["applied"] == len(inventory[rel] - refused(rel, namespace)), f"{rel}: {data}"
            set_of.update(dict.fromkeys(inventory[rel], applyset_of(data)))
        urls = {ref: locate.url(ref) for ref in sorted(set_of)}
        ours = snapshot(kube, urls)
        not_applied = set().union(*(refused(rel, namespace) for rel in files))
        assert sorted(urls.keys() - not_applied - ours.keys()) == [], "in a set, but not in the cluster"

        # 2. Deleting the files deletes every object. The custom resources' files go in a batch before the
        #    CRDs' (test_removing_resources_whose_crd_is_gone shows why).
        for path in paths:
            path.unlink()
        crd_paths = [p for rel, p in zip(files, paths, strict=True) if declares_crds(render(rel))]
        removed = await h.sync(*(p for p in paths if p not in crd_paths))
        removed.update(await h.sync(*crd_paths))
        not_removed = {str(p.relative_to(h.root)): r for p, r in removed.items() if not isinstance(r, Ack)}
        assert not not_removed, "\n".join(f"{rel}: {res}" for rel, res in sorted(not_removed.items()))
        await wait_deleted(kube, urls, "reloadd's objects after their files were deleted")

        # 3. kubectl, file by file, into the same places: the same objects per file as reloadd's sets.
        kubectl_done = False
        applied = await kubectl_apply(kubectl, rendered, files, namespace)
        declared = {rel: {ref_of(o) for o in objs} | refused(rel, namespace) for rel, objs in applied.items()}
        urls.update((ref, locate.url(ref)) for refs in declared.values() for ref in refs if ref not in urls)
        kubectl_done = True
        for rel in files:
            assert inventory[rel] == declared[rel], f"{rel}: {sorted(inventory[rel] ^ declared[rel])}"
        assert len(urls) == EXPECTED_OBJECTS, "the corpus changed: update EXPECTED_OBJECTS"
        theirs = snapshot(kube, urls)
        assert sorted(ours.keys() ^ theirs.keys()) == [], "objects only one side created"

        # 4. The same content, the same fields claimed by each side's field manager.
        problems: list[str] = []
        for ref, obj in sorted(ours.items()):
            label = (obj["metadata"].get("labels") or {}).get(LABEL_PART_OF)
            if label != set_of[ref]:
                problems.append(f"{ref}: member label {label!r}, not {set_of[ref]!r}")
            if not any(m.get("manager") == RELOADD_MANAGER for m in obj["metadata"].get("managedFields") or ()):
                problems.append(f"{ref}: not applied by {RELOADD_MANAGER}")
            problems.extend(f"{ref} {d}" for d in diff(comparable(theirs[ref]), comparable(obj)))
            problems.extend(
                f"{ref} managedFields{d}" for d in diff(applied_fields(theirs[ref], KUBECTL_MANAGER),
                                                       applied_fields(obj, RELOADD_MANAGER))
            )
        assert not problems, "\n".join(problems)
    finally:
        for url in reversed(urls.values()):
            kube.request("DELETE", url)
        if not kubectl_done:  # kubectl failed before all of its objects were known
            with contextlib.suppress(AssertionError):  # a kind whose CRD is gone cannot be resolved
                await kubectl("delete", "--ignore-not-found", "--wait=false", *files_args(rendered, files[::-1]))
        kube.request("DELETE", f"/api/v1/namespaces/{namespace}")


async def test_removing_resources_whose_crd_is_gone(make_harness: Any, kube: KubeCluster, namespace: str,
                                                    tmp_path: Path) -> None:
    """Removing custom resources after their CRD is gone acks and removes the parent (was: a stale-discovery
    404 rejected the file for good and left the parent behind)."""
    # `rm -r prometheus-operator/` hands both deletes over in one batch, the CRD's file first in path order;
    # whether its CRD is finalised before the next file's turn is a race (the corpus test loses it). Waiting
    # between two batches makes it certain.
    crd_rel = "prometheus-operator/crds/monitoring.coreos.com_servicemonitors.yaml"
    cr_rel = "prometheus-operator/getting-started/example-app-service-monitor.yaml"
    crd_url = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/servicemonitors.monitoring.coreos.com"
    h: Harness = await make_harness(kubeconfig_in(kube, namespace, tmp_path / "kubeconfig.json"),
                                    namespace=namespace)
    crd, cr = h.write(crd_rel, render(crd_rel)), h.write(cr_rel, render(cr_rel))
    try:
        results = await reloadd_apply(h, [crd, cr])
        assert all(isinstance(r, Ack) for r in results.values()), results
        cr_result = results[cr]
        assert isinstance(cr_result, Ack) and isinstance(cr_result.data, dict)
        cr_data = cr_result.data
        crd.unlink()
        assert isinstance((await h.sync(crd))[crd], Ack)
        await wait_deleted(kube, {"crd": crd_url}, "the CRD")
        cr.unlink()
        res = (await h.sync(cr))[cr]
        assert isinstance(res, Ack), res
        ns, name = cr_data["parent"].split("/")
        assert kube.get(f"/api/v1/namespaces/{ns}/configmaps/{name}") is None, "parent left behind"
    finally:
        kube.request("DELETE", crd_url)
        kube.request("DELETE", f"/api/v1/namespaces/{namespace}")
