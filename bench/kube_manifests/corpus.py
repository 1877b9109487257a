"""The third-party manifest corpus (tests/kube_manifests/corpus): first pass and edit latency, reloadd vs kubectl.

Each run starts a fresh kube-apiserver v1.20.2 for each side (cluster-scoped objects cannot share one
server), alternating which side goes first:

* first pass: reloadd's consumer takes every file in one batch, as at start-up, and files answered Retry
  (custom resources whose CRD is not served yet) are handed over again, as the engine would, without its
  backoff sleeps; kubectl is a loop of one ``kubectl apply --server-side -f FILE`` per file, CRDs and
  Namespaces first and ``kubectl wait --for=condition=established`` between, as an operator's script must;
* edit latency: a save of one file (a line appended: the content changes, the objects do not) applied by
  the consumer (one file per batch) vs one ``kubectl apply --server-side -f FILE`` process, for a small, a
  middle-sized and a large file.

The nine files kube-apiserver 1.20 refuses for both tools (see ``REFUSED_BY_1_20``) are part of both passes.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from reloadd import Retry
from tests.kube.apiserver import KubeCluster
from tests.kube_manifests._corpus import KUBECTL, corpus_files, creates_prerequisites, declares_crds, render

from ._driver import Driver

EDITED = (
    "k3s/rolebindings.yaml",
    "k3s/coredns.yaml",
    "prometheus-operator/crds/monitoring.coreos.com_prometheuses.yaml",
)
NAMESPACE = "bench-corpus"


def _prepare(kube: KubeCluster, work: Path) -> tuple[Path, Path, list[str]]:
    """The rendered corpus and a kubeconfig whose default namespace is :data:`NAMESPACE`."""
    root = work / "corpus"
    files = corpus_files()
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(render(rel))
    config = json.loads(kube.kubeconfig.read_text())
    for ctx in config["contexts"]:
        ctx["context"]["namespace"] = NAMESPACE
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(json.dumps(config))
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
               f"/api/v1/namespaces/{NAMESPACE}")
    return root, kubeconfig, files


def _edit(path: Path, n: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(path.read_bytes() + f"\n# edit {n}\n".encode())
    tmp.rename(path)


async def _reloadd_side(kube: KubeCluster, work: Path, edits: int) -> dict[str, Any]:
    root, kubeconfig, files = _prepare(kube, work)
    c = Driver(root, {"kubeconfig": str(kubeconfig), "namespace": NAMESPACE}, strict=False)
    await c.sync([])  # discovery, as a running daemon has it
    t0 = time.perf_counter()
    pending = [root / rel for rel in files]
    for _ in range(10):
        pending = [p for p, r in (await c.sync(pending)).items() if isinstance(r, Retry)]
        if not pending:
            break
    first = time.perf_counter() - t0
    if pending:
        raise RuntimeError(f"reloadd: still retrying after 10 passes: {pending}")
    lat: dict[str, list[float]] = {rel: [] for rel in EDITED}
    for n in range(edits):
        for rel in EDITED:
            _edit(root / rel, n)
            t0 = time.perf_counter()
            await c.sync([root / rel])
            lat[rel].append(time.perf_counter() - t0)
    await c.consumer.close()
    return {"first_pass_s": first, "edit_s": lat}


def _kubectl(kubeconfig: Path, cache: Path, *args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([str(KUBECTL), f"--kubeconfig={kubeconfig}", f"--cache-dir={cache}", *args],
                   capture_output=True, check=False)
    return time.perf_counter() - t0


def _kubectl_side(kube: KubeCluster, work: Path, edits: int) -> dict[str, Any]:
    root, kubeconfig, files = _prepare(kube, work)
    cache = work / "kubectl-cache"
    apply = ("apply", "--server-side", "--validate=false", "-f")
    t0 = time.perf_counter()
    first = [rel for rel in files if creates_prerequisites((root / rel).read_bytes())]
    for rel in first:
        _kubectl(kubeconfig, cache, *apply, str(root / rel))
    crds = [a for rel in first if declares_crds((root / rel).read_bytes()) for a in ("-f", str(root / rel))]
    _kubectl(kubeconfig, cache, "wait", "--for=condition=established", "--timeout=60s", *crds)
    for rel in files:
        if rel not in first:
            _kubectl(kubeconfig, cache, *apply, str(root / rel))
    first_s = time.perf_counter() - t0
    lat: dict[str, list[float]] = {rel: [] for rel in EDITED}
    for n in range(edits):
        for rel in EDITED:
            _edit(root / rel, n)
            lat[rel].append(_kubectl(kubeconfig, cache, *apply, str(root / rel)))
    return {"first_pass_s": first_s, "edit_s": lat}


async def run(runs: int = 3, edits: int = 10) -> dict[str, Any]:
    """``runs`` interleaved pairs; per side the first-pass times and per-file edit latencies."""
    out: dict[str, Any] = {"runs": runs, "edits": edits, "files": len(corpus_files()),
                           "reloadd": [], "kubectl": []}
    for i in range(runs):
        for side in (("kubectl", "reloadd") if i % 2 == 0 else ("reloadd", "kubectl")):
            with tempfile.TemporaryDirectory(prefix=f"bench-corpus-{side}-") as tmp:
                async with KubeCluster(controllers=()) as kube:
                    if side == "reloadd":
                        res = await _reloadd_side(kube, Path(tmp), edits)
                    else:
                        res = await asyncio.to_thread(_kubectl_side, kube, Path(tmp), edits)
            out[side].append(res)
            print(f"  corpus run {i + 1} {side}: first pass {res['first_pass_s']:.2f}s", flush=True)
    return out


def markdown_rows(r: dict[str, Any]) -> list[str]:
    """Rows for the kube-manifests table of docs/benchmarks.md."""
    med = statistics.median
    k_first = [x["first_pass_s"] for x in r["kubectl"]]
    o_first = [x["first_pass_s"] for x in r["reloadd"]]
    rows = [
        f"| corpus ({r['files']} third-party files), first pass, fresh server, median of {r['runs']} "
        f"| {med(k_first):.1f} s (loop, CRDs first) | {med(o_first):.1f} s (one batch) "
        f"| **{med(k_first) / med(o_first):.1f}** |"
    ]
    for rel in EDITED:
        k = [t for x in r["kubectl"] for t in x["edit_s"][rel]]
        o = [t for x in r["reloadd"] for t in x["edit_s"][rel]]
        size = len(render(rel)) // 1024
        rows.append(f"| corpus edit of `{rel}` ({size} KiB), median of {len(o)} | {med(k) * 1000:.0f} ms "
                    f"| {med(o) * 1000:.0f} ms | **{med(k) / med(o):.1f}** |")
    return rows
