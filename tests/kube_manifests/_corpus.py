"""The third-party manifest corpus (``corpus/``) and what comparing two applies of it needs.

The files are upstream's, byte for byte (see ``corpus/README.md``). Only k3s's bundled manifests are
templates: k3s replaces ``%{NAME}%`` placeholders before it writes them to its manifests directory, and
:func:`render` does the same with the values below, for both sides of the comparison.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reloadd_kube_manifests import LABEL_PART_OF

from tests.kube.apiserver import KubeCluster

__all__ = [
    "CORPUS",
    "K3S_VALUES",
    "KUBECTL",
    "REFUSED_BY_1_20",
    "SSA_PROTOCOL_ERROR",
    "Kubectl",
    "Locator",
    "applied_fields",
    "comparable",
    "corpus_files",
    "creates_prerequisites",
    "declares_crds",
    "diff",
    "ref_of",
    "render",
]

CORPUS = Path(__file__).with_name("corpus")
KUBECTL = Path(os.environ.get("RELOADD_KUBECTL", "/var/cache/reloadd/kubectl-v1.20.2/kubectl"))

#: What k3s substitutes into its bundled manifests (``pkg/deploy``); CLUSTER_DNS lies in the test
#: apiserver's service range 10.0.0.0/16.
K3S_VALUES = {
    "CLUSTER_DNS": "10.0.0.10",
    "CLUSTER_DOMAIN": "cluster.local",
    "SYSTEM_DEFAULT_REGISTRY": "",
    "DEFAULT_LOCAL_STORAGE_PATH": "/var/lib/rancher/k3s/storage",
}
#: Objects kube-apiserver 1.20 refuses to server-side apply, to kubectl as to anyone: a Service port without
#: ``protocol`` (structured-merge-diff#130/#183; the default is honoured from 1.21 on, kubernetes#98576).
#: Their files are still part of the corpus: both sides must refuse exactly these and apply the rest.
#: ``{default}`` is the namespace of the kubeconfig's context.
REFUSED_BY_1_20: dict[str, frozenset[str]] = {
    "ingress-nginx/baremetal/deploy.yaml": frozenset({"/Service/ingress-nginx/ingress-nginx-controller-admission"}),
    "kube-prometheus/node-exporter-service.yaml": frozenset({"/Service/monitoring/node-exporter"}),
    "kube-state-metrics/service.yaml": frozenset({"/Service/kube-system/kube-state-metrics"}),
    "kubernetes-examples/cassandra/cassandra-service.yaml": frozenset({"/Service/{default}/cassandra"}),
    "kubernetes-examples/guestbook-go/guestbook-service.json": frozenset({"/Service/{default}/guestbook"}),
    "kubernetes-examples/guestbook-go/redis-master-service.json": frozenset({"/Service/{default}/redis-master"}),
    "kubernetes-examples/guestbook-go/redis-replica-service.json": frozenset({"/Service/{default}/redis-replica"}),
    "prometheus-operator/getting-started/example-app-service.yaml": frozenset({"/Service/{default}/example-app"}),
    "prometheus-operator/rbac/prometheus-operator-service.yaml": frozenset({"/Service/default/prometheus-operator"}),
}
SSA_PROTOCOL_ERROR = 'omits key field "protocol"'
_PLACEHOLDER = re.compile(rb"%\{([A-Z_]+)\}%")
_SUFFIXES = frozenset({".yaml", ".yml", ".json"})
# A CRD or a Namespace is what other files' objects need first; matched on the text so that this side
# of the comparison does not depend on a YAML parser.
_PREREQUISITE = re.compile(rb"^kind:\s*[\"']?(CustomResourceDefinition|Namespace)[\"']?\s*$", re.M)
_CRD = re.compile(rb"^kind:\s*[\"']?CustomResourceDefinition[\"']?\s*$", re.M)
# Written by the API server, or by controllers: differ between any two creations of the same manifest.
_SERVER_METADATA = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation", "selfLink")


def corpus_files() -> list[str]:
    """Every manifest of the corpus, as sorted POSIX paths relative to :data:`CORPUS`."""
    return sorted(
        p.relative_to(CORPUS).as_posix() for p in CORPUS.rglob("*")
        if p.is_file() and p.suffix.lower() in _SUFFIXES
    )


def render(rel: str) -> bytes:
    """The bytes of corpus file ``rel`` as they are applied (k3s templates filled in)."""
    data = (CORPUS / rel).read_bytes()
    if rel.startswith("k3s/"):
        data = _PLACEHOLDER.sub(lambda m: K3S_VALUES[m.group(1).decode()].encode(), data)
    return data


def creates_prerequisites(data: bytes) -> bool:
    """Whether a manifest holds a CRD or a Namespace (kubectl must apply those before the rest)."""
    return _PREREQUISITE.search(data) is not None


def declares_crds(data: bytes) -> bool:
    """Whether a manifest holds a CRD."""
    return _CRD.search(data) is not None


def ref_of(obj: dict[str, Any]) -> str:
    """``group/Kind/namespace/name``: the form of reloadd's ApplySet inventory lines."""
    api_version = str(obj["apiVersion"])
    group = api_version.rpartition("/")[0]
    meta = obj["metadata"]
    return f"{group}/{obj['kind']}/{meta.get('namespace') or ''}/{meta['name']}"


class Locator:
    """Object URLs from the API server's discovery, so objects can be read without kubectl's help.

    Objects are read at their group's preferred version, whatever version a manifest used, so both sides
    are read alike. Resolve every URL while the kinds are served: a deleted CRD takes its kind along.

    Args:
        kube: The cluster.
    """

    def __init__(self, kube: KubeCluster) -> None:
        self.kube = kube
        self._resources: dict[tuple[str, str], tuple[str, str, bool]] = {}  # (group, kind) → base, plural, ns?

    def _discover(self) -> None:
        versions = ["v1"]
        for g in self.kube.get("/apis")["groups"]:  # the preferred version first: it wins below
            preferred = g["preferredVersion"]["groupVersion"]
            versions += [preferred, *(v["groupVersion"] for v in g["versions"] if v["groupVersion"] != preferred)]
        for gv in versions:
            base = "/api/v1" if gv == "v1" else f"/apis/{gv}"
            listing = self.kube.get(base) or {"resources": []}
            group = gv.rpartition("/")[0]
            for res in listing["resources"]:
                if "/" not in res["name"]:
                    self._resources.setdefault((group, res["kind"]), (base, res["name"], res["namespaced"]))

    def url(self, ref: str) -> str:
        """The URL path of the object ``group/Kind/namespace/name``."""
        group, kind, namespace, name = ref.split("/", 3)
        if (group, kind) not in self._resources:
            self._discover()
        base, plural, namespaced = self._resources[(group, kind)]
        where = f"{base}/namespaces/{namespace}" if namespaced else base
        return f"{where}/{plural}/{name}"


def _replace(value: Any, old: str, new: str) -> Any:
    if isinstance(value, dict):
        return {k: _replace(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, old, new) for v in value]
    return new if value == old else value


def comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` without what legitimately differs between two creations of it.

    Dropped: server-written metadata, ``status``, reloadd's ApplySet member label, the addresses and node
    ports the server allocates to Services. The object's own uid, which the server copies into a Job's
    selector and pod labels (``controller-uid``), becomes ``<uid>``.
    """
    out: dict[str, Any] = copy.deepcopy(obj)
    uid = str(out["metadata"].get("uid") or "")
    if uid:
        out = _replace(out, uid, "<uid>")
    meta = out["metadata"]
    for key in _SERVER_METADATA:
        meta.pop(key, None)
    labels = meta.get("labels") or {}
    labels.pop(LABEL_PART_OF, None)
    for key in ("labels", "annotations"):
        if not meta.get(key):
            meta.pop(key, None)
    out.pop("status", None)
    if out["kind"] == "Service" and out["apiVersion"] == "v1":
        spec = out.get("spec") or {}
        spec.pop("clusterIP", None)
        spec.pop("clusterIPs", None)
        spec.pop("healthCheckNodePort", None)
        for port in spec.get("ports") or ():
            port.pop("nodePort", None)
    return out


def applied_fields(obj: dict[str, Any], manager: str) -> Any:
    """The field set ``manager`` owns through server-side apply, without reloadd's member label.

    Comparing these catches a field a side did not send although the server defaulted it to the same
    value (``protocol: TCP``), which the object alone cannot show. An apply that sets nothing but the
    name (a bare Namespace) leaves no entry at all: that is an empty set.

    Raises:
        AssertionError: when ``manager`` changed the object other than by server-side apply.
    """
    entries = [m for m in obj["metadata"].get("managedFields") or () if m.get("manager") == manager]
    assert all(m.get("operation") == "Apply" for m in entries), f"{ref_of(obj)}: {manager} did not apply: {entries}"
    fields = copy.deepcopy(entries[0].get("fieldsV1") or {}) if entries else {}
    meta = fields.get("f:metadata") or {}
    labels = meta.get("f:labels") or {}
    labels.pop(f"f:{LABEL_PART_OF}", None)
    if "f:labels" in meta and not any(key.startswith("f:") for key in labels):
        del meta["f:labels"]  # only "." is left: the map reloadd created for its label
    if "f:metadata" in fields and not meta:
        del fields["f:metadata"]
    return fields


def diff(a: Any, b: Any, path: str = "") -> Iterator[str]:
    """The paths where ``a`` and ``b`` differ, with both values (for readable assertion messages)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(a.keys() | b.keys()):
            sub = f"{path}.{key}"
            if key not in a:
                yield f"{sub}: only in reloadd's: {json.dumps(b[key])[:200]}"
            elif key not in b:
                yield f"{sub}: only in kubectl's: {json.dumps(a[key])[:200]}"
            else:
                yield from diff(a[key], b[key], sub)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from diff(x, y, f"{path}[{i}]")
    elif a != b or type(a) is not type(b):
        yield f"{path or '.'}: kubectl {json.dumps(a)[:200]} != reloadd {json.dumps(b)[:200]}"


class Kubectl:
    """Runs :data:`KUBECTL` (Debian's v1.20.2, never the one on PATH) against one kubeconfig.

    Args:
        kubeconfig: The kubeconfig to use.
        cache_dir: kubectl's discovery cache (kept out of ``~/.kube``).
        parallel: How many kubectl processes may run at once.
    """

    def __init__(self, kubeconfig: Path, cache_dir: Path, parallel: int = 4) -> None:
        assert KUBECTL.exists(), f"{KUBECTL} missing: run `make kube` (scripts/infra/fetch-kubectl.sh)"
        self.kubeconfig = kubeconfig
        self.cache_dir = cache_dir
        self._slots = asyncio.Semaphore(parallel)

    async def __call__(self, *args: str, timeout: float = 90.0) -> str:
        """Run ``kubectl ARGS``; its stdout.

        Raises:
            AssertionError: when kubectl fails (with its stderr).
        """
        returncode, out, err = await self.run(*args, timeout=timeout)
        assert returncode == 0, f"kubectl {' '.join(args)[:300]} failed ({returncode}): {err}"
        return out

    async def run(self, *args: str, timeout: float = 90.0) -> tuple[int, str, str]:
        """Run ``kubectl ARGS``; its exit status, stdout and stderr."""
        argv = [str(KUBECTL), f"--kubeconfig={self.kubeconfig}", f"--cache-dir={self.cache_dir}", *args]
        async with self._slots:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(), timeout)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                raise
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    async def objects(self, *args: str) -> list[dict[str, Any]]:
        """``kubectl ARGS -o json`` as a list of objects (one object, or a ``List``'s items)."""
        out = await self(*args, "-o", "json")
        if not out.strip():
            return []
        value = json.loads(out)
        items = value["items"] if value.get("kind") == "List" else [value]
        return [dict(i) for i in items]
