"""Benchmark: save → Available for a one-replica Deployment on a real node, reloadd vs kubectl.

    python -m bench.kube_manifests.node [--rounds 10] [--json out.json] [--md out.md]

Starts the test bed's node (tests/kube/node.py: kube-apiserver, controller-manager, kube-scheduler, a
private containerd 1.6 and a kubelet v1.20.2), imports one busybox image, then per round, alternating
the two tools on the same node:

* reloadd: the real engine (``Reloader``, inotify, the ``quiet`` settle window) watching a manifests
  folder; a new Deployment file is renamed in; one clock stops when the Deployment is rolled out with
  its replica available (seen on the API server's watch), another when reloadd itself reports the file
  Current (its status: the file no longer listed as applying/progressing, the save-to-current histogram
  counted it), which is what a consumer ordered ``after`` it waits for.
* kubectl: the same Deployment under another name written to a file, then
  ``kubectl apply -f FILE`` and ``kubectl rollout status deployment/NAME`` (Debian's v1.20.2); the clock
  stops when ``rollout status`` returns.

Both end at the same state (what ``rollout status`` waits for: observed generation, updated and available
replicas); most of either time is the node's: schedule, sandbox, container start, Ready.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import reloadd
from tests.infra import SERVE, busybox_image, write_oci_archive
from tests.kube.apiserver import KubeCluster
from tests.kube.node import kube_with_node
from tests.kube.watch import wait_for
from tests.kube_manifests._corpus import KUBECTL
from tests.node.support import available, deployment, ensure_namespace, yaml_of

from ._output import emit

IMAGE = "docker.io/bench/web:v1"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.rename(path)


def _kubectl(kube: KubeCluster, env: dict[str, str], *args: str) -> None:
    proc = subprocess.run([str(KUBECTL), "--kubeconfig", str(kube.kubeconfig), *args],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")


def kubectl_round(kube: KubeCluster, work: Path, ns: str, name: str, env: dict[str, str]) -> float:
    """``kubectl apply -f`` + ``kubectl rollout status``: seconds from the file written to rolled out."""
    path = work / f"{name}.yaml"
    path.write_text(yaml_of(deployment(name, ns, IMAGE)))
    t0 = time.perf_counter()
    _kubectl(kube, env, "apply", "-f", str(path))
    _kubectl(kube, env, "rollout", "status", "-n", ns, f"deployment/{name}", "--timeout=120s")
    return time.perf_counter() - t0


def _to_current(r: reloadd.Reloader) -> int:
    report = next(c.health for c in r.snapshot().consumers if c.name == "manifests")
    return report.to_current.count if report is not None else 0


async def reloadd_round(r: reloadd.Reloader, kube: KubeCluster, root: Path, ns: str, name: str) -> tuple[float, float]:
    """A file renamed into the watched folder: seconds until its Deployment is rolled out (the API server's
    watch), and until reloadd reports the file Current (its own status, polled every 5 ms)."""
    path = root / f"{name}.yaml"
    counted = _to_current(r)
    t0 = time.perf_counter()
    _write(path, yaml_of(deployment(name, ns, IMAGE)))

    async def current() -> float:
        while True:
            doc = r.status()["consumers"]["manifests"]
            listed = any(f["path"] == str(path) for f in doc["health"]["files"])
            if _to_current(r) > counted and not listed:
                return time.perf_counter() - t0
            await asyncio.sleep(0.005)

    reported = asyncio.ensure_future(asyncio.wait_for(current(), 120))
    await asyncio.to_thread(wait_for, kube, f"/apis/apps/v1/namespaces/{ns}/deployments", available,
                            name=name, timeout=120)
    rolled_out = time.perf_counter() - t0
    return rolled_out, await reported


def _stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"median_ms": round(statistics.median(xs) * 1000, 1), "p90_ms": round(xs[int(len(xs) * 0.9) - 1] * 1000, 1),
            "min_ms": round(xs[0] * 1000, 1)}


async def run(rounds: int, quiet: str) -> dict[str, Any]:
    """Both tools, ``rounds`` Deployments each, alternating on one node."""
    if not KUBECTL.exists():
        raise SystemExit(f"kubectl not found at {KUBECTL}: run `make kube` (scripts/infra/fetch-kubectl.sh)")
    work = Path(tempfile.mkdtemp(prefix="reloadd-bench-node-"))
    try:
        with kube_with_node() as node:
            kube = node.cluster
            archive = work / "web.tar"
            write_oci_archive(archive, [busybox_image(IMAGE, SERVE)])
            node.ctr("images", "import", str(archive))
            r_ns, k_ns = ensure_namespace(kube, "bench-reloadd"), ensure_namespace(kube, "bench-kubectl")
            root = work / "manifests"
            root.mkdir()
            env = {**os.environ, "HOME": str(work / "home")}  # kubectl's discovery cache, warm after round 1
            cfg = reloadd.parse_config({
                "reloadd": {"state_dir": str(work / "state"), "quiet": quiet},
                "consumer": [{"name": "manifests", "plugin": "kube-manifests", "paths": [str(root)],
                              "options": {"kubeconfig": str(kube.kubeconfig)}}],
            })
            r_times: list[float] = []
            c_times: list[float] = []
            k_times: list[float] = []
            async with reloadd.Reloader(cfg) as r:
                await r.wait_idle(60)
                # one warm-up each: the first pod of a namespace and kubectl's discovery cache
                await reloadd_round(r, kube, root, r_ns, "warm")
                await asyncio.to_thread(kubectl_round, kube, work, k_ns, "warm", env)
                for i in range(rounds):
                    await r.wait_idle(60)
                    rolled_out, reported = await reloadd_round(r, kube, root, r_ns, f"web{i}")
                    r_times.append(rolled_out)
                    c_times.append(reported)
                    k_times.append(await asyncio.to_thread(kubectl_round, kube, work, k_ns, f"web{i}", env))
            node.assert_running()
        leftovers = node.leftovers()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios = [k / r for k, r in zip(k_times, r_times, strict=True)]
    c_ratios = [k / c for k, c in zip(k_times, c_times, strict=True)]
    return {"rounds": rounds, "quiet": quiet, "reloadd": _stats(r_times), "reloadd_current": _stats(c_times),
            "kubectl": _stats(k_times), "median_ratio_kubectl_over_reloadd": round(statistics.median(ratios), 2),
            "median_ratio_kubectl_over_reloadd_current": round(statistics.median(c_ratios), 2),
            "leftovers": leftovers}


def markdown(r: dict[str, Any]) -> str:
    """The docs/benchmarks.md section for one run."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    k, rl, c = r["kubectl"], r["reloadd"], r["reloadd_current"]
    return "\n".join([
        f"## kube-manifests on a real node: save → Available ({when})",
        "",
        f"A one-replica Deployment of a locally imported image (`imagePullPolicy: Never`) on the test bed's node "
        f"(kubelet v1.20.2, containerd 1.6); {r['rounds']} Deployments per tool, alternating. reloadd: the file "
        f"renamed into the watched folder (engine, quiet {r['quiet']}) until the Deployment is rolled out; kubectl: "
        "`kubectl apply -f` + `kubectl rollout status`.",
        "",
        "| measure | kubectl | reloadd | kubectl / reloadd (median of per-round ratios) |",
        "|---|---|---|---|",
        f"| save → Available, median / p90 | {k['median_ms']:.0f} / {k['p90_ms']:.0f} ms | "
        f"{rl['median_ms']:.0f} / {rl['p90_ms']:.0f} ms | **{r['median_ratio_kubectl_over_reloadd']:.2f}** |",
        f"| save → reloadd reports the file Current (its status), median / p90 | {k['median_ms']:.0f} / "
        f"{k['p90_ms']:.0f} ms (`rollout status` returned) | {c['median_ms']:.0f} / {c['p90_ms']:.0f} ms | "
        f"**{r['median_ratio_kubectl_over_reloadd_current']:.2f}** |",
        "",
    ])


async def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.kube_manifests.node", description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--quiet", default="100ms", help="the engine's settle window")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args(argv)
    result = await run(args.rounds, args.quiet)
    emit(result, args.json, args.md, markdown)
    return result


if __name__ == "__main__":
    sys.exit(0 if asyncio.run(main()) else 1)
