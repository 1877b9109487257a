"""Benchmark: reloadd's kube-manifests consumer vs ``kubectl apply --server-side -f`` per file.

    python -m bench.kube_manifests [--files 100] [--objects 10] [--saves 20] [--json out.json] [--md out.md]

Starts a private kube-apiserver v1.20.2 (see tests/kube/apiserver.py), writes ``--files`` manifest files of
``--objects`` objects each (ConfigMaps, Secrets, a ServiceAccount, a Role, a Service), then measures on the
same server, in separate namespaces so neither tool sees the other's objects:

1. per file, first apply (create) and second apply (one value changed): reloadd's consumer (one file per
   batch, the way a single save arrives) vs one ``kubectl apply --server-side -f FILE`` process per file
   (what k3s-like tooling or a shell loop does); reports the median per-file ratio kubectl / reloadd;
2. all files in one batch (reloadd's startup pass; measured first, on the fresh server) vs the kubectl
   loop's total;
3. file save → object visible in the API: the real engine (inotify, ``quiet`` settle window) writes are
   atomic renames, visibility is polled every 2 ms;
4. the third-party corpus of tests/kube_manifests/corpus: first pass and edit latency vs a kubectl loop
   (see bench/kube_manifests/corpus.py; ``--corpus-runs 0`` skips it);
5. a folder with its Namespace (``000-ns.yaml``) and ``--files`` files of ``--objects`` ConfigMaps in it: the
   daemon's first pass (start to idle, the real engine) vs ``kubectl apply --server-side -f DIR`` (lexical
   order, one request per object), alternating, ``--folder-runs`` pairs; reloadd's retries (a 404 on a
   namespace not created yet) are counted and must be 0 (``--only-folder`` runs just this phase). A third
   contender in each run is the Python floor (``floor.py``): reloadd's own HTTP client sending just the
   1,001 server-side applies, ``parallel`` at once, nothing else; the three go in a rotating order.
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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml
from reloadd_kube_manifests._settings import Settings

import reloadd
from tests.kube.apiserver import KubeCluster
from tests.kube_manifests._corpus import KUBECTL

from ._driver import Driver
from ._output import emit
from .floor import floor_pass


def objects(ns: str, file_no: int, n: int, rev: int) -> list[dict[str, Any]]:
    """``n`` objects of mixed kinds for file ``file_no`` at revision ``rev``."""
    out: list[dict[str, Any]] = []
    kinds = ["ConfigMap"] * 5 + ["Secret"] * 2 + ["ServiceAccount", "Role", "Service"]
    for i in range(n):
        kind = kinds[i % len(kinds)]
        name = f"f{file_no}-{kind.lower()}-{i}"
        meta = {"name": name, "namespace": ns, "labels": {"bench": "kube-manifests"}}
        if kind == "ConfigMap":
            out.append({"apiVersion": "v1", "kind": kind, "metadata": meta,
                        "data": {"rev": str(rev), "payload": "x" * 200}})
        elif kind == "Secret":
            out.append({"apiVersion": "v1", "kind": kind, "metadata": meta, "stringData": {"rev": str(rev)}})
        elif kind == "ServiceAccount":
            meta["annotations"] = {"rev": str(rev)}
            out.append({"apiVersion": "v1", "kind": kind, "metadata": meta})
        elif kind == "Role":
            out.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
                        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]})
        else:
            out.append({"apiVersion": "v1", "kind": kind, "metadata": meta,
                        # protocol is required by 1.20's server-side apply (no default in its schema)
                        "spec": {"ports": [{"port": 80 + rev % 100, "protocol": "TCP"}],
                                 "selector": {"app": name}}})
    return out


def write(path: Path, objs: list[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump_all(objs, sort_keys=False))
    tmp.rename(path)


def ensure_ns(kube: KubeCluster, ns: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
    kube.apply(body, f"/api/v1/namespaces/{ns}")


def kubectl(kube: KubeCluster, path: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([str(KUBECTL), "--kubeconfig", str(kube.kubeconfig), "apply", "--server-side",
                           "--force-conflicts", "-f", str(path)], capture_output=True, env=env, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl apply -f {path} failed: {proc.stderr.strip()}")
    return time.perf_counter() - t0


def summary(name: str, xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {f"{name}_median_ms": round(statistics.median(xs) * 1000, 2),
            f"{name}_p90_ms": round(xs[int(len(xs) * 0.9) - 1] * 1000, 2),
            f"{name}_total_s": round(sum(xs), 3)}


async def per_file(kube: KubeCluster, work: Path, n_files: int, n_obj: int) -> dict[str, Any]:
    if shutil.which(str(KUBECTL)) is None:  # the comparison is the point: never drop it silently
        raise SystemExit(f"kubectl not found at {KUBECTL}: run `make kube` (scripts/infra/fetch-kubectl.sh)")
    have_kubectl = True
    for ns in ("bench-reloadd", "bench-kubectl", "bench-batch"):
        ensure_ns(kube, ns)
    r_root, k_root, b_root = work / "reloadd", work / "kubectl", work / "batch"
    for d in (r_root, k_root, b_root):
        d.mkdir()
    env = {**os.environ, "HOME": str(work / "home")}  # kubectl's discovery cache, warm after file 1
    driver = Driver(r_root, {"kubeconfig": str(kube.kubeconfig)})
    batch = Driver(b_root, {"kubeconfig": str(kube.kubeconfig)})
    try:
        return await _per_file(kube, driver, batch, r_root, k_root, b_root, env, n_files, n_obj, have_kubectl)
    finally:
        await driver.consumer.close()
        await batch.consumer.close()


async def _per_file(
    kube: KubeCluster, driver: Driver, batch: Driver, r_root: Path, k_root: Path, b_root: Path,
    env: dict[str, str], n_files: int, n_obj: int, have_kubectl: bool,
) -> dict[str, Any]:
    result: dict[str, Any] = {"files": n_files, "objects_per_file": n_obj, "kubectl": have_kubectl}
    await driver.sync([])  # discovery, as a running daemon has it already
    # Startup pass: every file in one batch (first, on a fresh server: it slows down as objects pile up).
    await batch.sync([])
    paths = []
    for i in range(n_files):
        p = b_root / f"m{i:03}.yaml"
        write(p, objects("bench-batch", i, n_obj, 1))
        paths.append(p)
    t0 = time.perf_counter()
    await batch.sync(paths)
    result["one_batch_all_files_s"] = round(time.perf_counter() - t0, 3)
    for rev, phase in ((1, "create"), (2, "update")):
        r_times: list[float] = []
        k_times: list[float] = []
        for i in range(n_files):
            rp, kp = r_root / f"m{i:03}.yaml", k_root / f"m{i:03}.yaml"
            write(rp, objects("bench-reloadd", i, n_obj, rev))
            write(kp, objects("bench-kubectl", i, n_obj, rev))
            t0 = time.perf_counter()
            await driver.sync([rp])
            r_times.append(time.perf_counter() - t0)
            if have_kubectl:
                k_times.append(kubectl(kube, kp, env))
        result.update({f"{phase}_{k}": v for k, v in summary("reloadd", r_times).items()})
        if have_kubectl:
            result.update({f"{phase}_{k}": v for k, v in summary("kubectl", k_times).items()})
            ratios = [k / r for k, r in zip(k_times, r_times, strict=True)]
            result[f"{phase}_median_ratio_kubectl_over_reloadd"] = round(statistics.median(ratios), 2)
    return result


async def save_to_visible(kube: KubeCluster, work: Path, saves: int, quiet: str) -> dict[str, Any]:
    ns = "bench-latency"
    ensure_ns(kube, ns)
    root = work / "latency"
    root.mkdir()
    target = root / "app.yaml"
    write(target, objects(ns, 0, 10, 0))
    cfg = reloadd.parse_config({
        "reloadd": {"state_dir": str(work / "latency-state"), "quiet": quiet},
        "consumer": [{"name": "manifests", "plugin": "kube-manifests", "paths": [str(root)],
                      "options": {"kubeconfig": str(kube.kubeconfig)}}],
    })
    path = f"/api/v1/namespaces/{ns}/configmaps/f0-configmap-0"
    lat: list[float] = []
    async with reloadd.Reloader(cfg) as r:
        await r.wait_idle(60)
        for rev in range(1, saves + 1):
            write(target, objects(ns, 0, 10, rev))
            t0 = time.perf_counter()
            while True:
                obj = await asyncio.to_thread(kube.get, path)
                if obj and obj["data"]["rev"] == str(rev):
                    break
                if time.perf_counter() - t0 > 30:
                    raise RuntimeError("object never became visible")
                await asyncio.sleep(0.002)
            lat.append(time.perf_counter() - t0)
            await r.wait_idle(30)
    return {"quiet": quiet, "saves": saves, **summary("save_to_visible", lat)}


def namespace_folder(root: Path, ns: str, n_files: int, n_obj: int) -> None:
    """``000-ns.yaml`` (the Namespace) and ``n_files`` files of ``n_obj`` ConfigMaps in it."""
    root.mkdir(parents=True)
    write(root / "000-ns.yaml", [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}])
    for i in range(n_files):
        write(root / f"{i + 1:03}-cms.yaml", [
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"f{i}-cm-{j}", "namespace": ns},
             "data": {"payload": "x" * 200}} for j in range(n_obj)])


def spread(xs: list[float]) -> str:
    """``median (min–max)`` in seconds."""
    return f"{statistics.median(xs):.2f} s ({min(xs):.2f}–{max(xs):.2f})"


async def folder_first_pass(kube: KubeCluster, work: Path, n_files: int, n_obj: int, runs: int,
                            options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Phase 5: the first pass over a folder whose Namespace is one of its files (issue #59); ``options``
    added to the consumer's (``--folder-concurrency``). Each run also times the Python floor (``floor.py``)
    with the consumer's ``parallel`` requests in flight."""
    env = {**os.environ, "HOME": str(work / "home")}
    in_flight = int((options or {}).get("parallel", Settings().parallel))
    r_times: list[float] = []
    k_times: list[float] = []
    f_times: list[float] = []
    retries: list[int] = []
    waited: list[float] = []
    for run in range(runs):
        k_root, r_root, f_root = work / f"folder-k{run}", work / f"folder-r{run}", work / f"folder-f{run}"
        namespace_folder(k_root, f"scale-k{run}", n_files, n_obj)
        namespace_folder(r_root, f"scale-r{run}", n_files, n_obj)
        namespace_folder(f_root, f"scale-f{run}", n_files, n_obj)
        cfg = reloadd.parse_config({
            "reloadd": {"state_dir": str(work / f"folder-state{run}"), "quiet": "100ms"},
            # A consumer name per run: its ApplySet parents are its own (the same name would prune the last run's).
            "consumer": [{"name": f"folder{run}", "plugin": "kube-manifests", "paths": [str(r_root)],
                          "options": {"kubeconfig": str(kube.kubeconfig), **(options or {})}}],
        })

        async def reloadd_pass(cfg: reloadd.Config = cfg) -> None:
            t0 = time.perf_counter()
            async with reloadd.Reloader(cfg) as r:
                await r.wait_idle(300)
                r_times.append(time.perf_counter() - t0)
                c = r.snapshot().consumers[0]
                retries.append(c.retried + c.rejected_total)
                waited.append(c.stats.get("files_waited_for_provider", 0.0))

        async def kubectl_pass(k_root: Path = k_root) -> None:
            k_times.append(await asyncio.to_thread(kubectl, kube, k_root, env))

        async def floor(f_root: Path = f_root) -> None:
            f_times.append(await floor_pass(kube.kubeconfig, f_root, in_flight))

        order: list[Callable[[], Awaitable[None]]] = [kubectl_pass, reloadd_pass, floor]
        for contender in order[run % 3:] + order[:run % 3]:  # none always first on a fresh server
            await contender()
    r_med, k_med, f_med = (statistics.median(xs) for xs in (r_times, k_times, f_times))
    return {
        "folder_files": n_files + 1, "folder_objects": n_files * n_obj + 1, "folder_runs": runs,
        "folder_reloadd_s": [round(x, 3) for x in r_times], "folder_kubectl_s": [round(x, 3) for x in k_times],
        "folder_reloadd_median_s": round(statistics.median(r_times), 3),
        "folder_kubectl_median_s": round(statistics.median(k_times), 3),
        "folder_floor_s": [round(x, 3) for x in f_times], "folder_floor_median_s": round(f_med, 3),
        "folder_floor_in_flight": in_flight,
        "folder_ratio_reloadd_over_kubectl": round(r_med / k_med, 2),
        "folder_ratio_floor_over_kubectl": round(f_med / k_med, 2),
        "folder_ratio_reloadd_over_floor": round(r_med / f_med, 2),
        "folder_per_run_ratio_reloadd_over_kubectl": [round(r / k, 2) for r, k in zip(r_times, k_times, strict=True)],
        "folder_per_run_ratio_floor_over_kubectl": [round(f / k, 2) for f, k in zip(f_times, k_times, strict=True)],
        "folder_spread": {"reloadd": spread(r_times), "kubectl": spread(k_times), "floor": spread(f_times)},
        "folder_reloadd_retries": retries, "folder_files_waited": waited,
    }


async def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.kube_manifests", description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--objects", type=int, default=10)
    ap.add_argument("--saves", type=int, default=20)
    ap.add_argument("--quiet", default="100ms", help="the engine's settle window for the latency test")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--md", type=Path, help="write the docs/benchmarks.md section here")
    ap.add_argument("--corpus-runs", type=int, default=3, help="fresh-server pairs for the corpus phase")
    ap.add_argument("--corpus-edits", type=int, default=10)
    ap.add_argument("--folder-runs", type=int, default=5, help="pairs for the namespace-folder first pass")
    ap.add_argument("--only-folder", action="store_true", help="run only the namespace-folder first pass")
    ap.add_argument("--folder-concurrency", type=int, help="the consumer's `concurrency` for that pass")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="reloadd-bench-km-"))
    try:
        if args.only_folder:
            async with KubeCluster(controllers=()) as kube:
                extra = {"concurrency": args.folder_concurrency} if args.folder_concurrency else {}
                result = await folder_first_pass(kube, work, args.files, args.objects, args.folder_runs, extra)
                result["folder_options"] = extra
            emit(result, args.json, args.md, folder_table)
            return result
        async with KubeCluster(controllers=()) as kube:
            result = await per_file(kube, work, args.files, args.objects)
            result.update(await save_to_visible(kube, work, args.saves, args.quiet))
            if args.folder_runs > 0:
                result.update(await folder_first_pass(kube, work, args.files, args.objects, args.folder_runs))
        if args.corpus_runs > 0:
            from .corpus import markdown_rows
            from .corpus import run as corpus_run

            corpus = await corpus_run(args.corpus_runs, args.corpus_edits)
            result["corpus"] = corpus
            result["corpus_rows"] = markdown_rows(corpus)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit(result, args.json, args.md, markdown)
    return result


def folder_row(r: dict[str, Any]) -> str:
    """The namespace-folder first pass (phase 5) as table rows: reloadd, then the Python floor; the last column
    is the ratio to kubectl against issue #59's target of ≤ 0.5 (medians, with min–max over the runs)."""
    sp = r.get("folder_spread", {})
    row = (
        f"| first pass, `000-ns.yaml` + {r['folder_files'] - 1} files ({r['folder_objects']} objects), "
        f"median (min–max) of {r['folder_runs']} rotating | {sp.get('kubectl', r['folder_kubectl_median_s'])} "
        f"(`kubectl apply --server-side -f DIR`) | {sp.get('reloadd', r['folder_reloadd_median_s'])} (daemon start "
        f"to idle; retries {max(r['folder_reloadd_retries'])}) | {1 / r['folder_ratio_reloadd_over_kubectl']:.2f} "
        f"(reloadd / kubectl **{r['folder_ratio_reloadd_over_kubectl']:.2f}×**, target ≤ 0.5×) |"
    )
    if "folder_floor_median_s" not in r:
        return row
    return row + (
        f"\n| the same, Python floor: reloadd's HTTP client sending only the {r['folder_objects']} applies, "
        f"{r['folder_floor_in_flight']} in flight, same runs | {sp.get('kubectl')} | {sp.get('floor')} (floor) | "
        f"{1 / r['folder_ratio_floor_over_kubectl']:.2f} "
        f"(floor / kubectl **{r['folder_ratio_floor_over_kubectl']:.2f}×**; "
        f"reloadd / floor {r['folder_ratio_reloadd_over_floor']:.2f}×) |"
    )


def folder_table(r: dict[str, Any]) -> str:
    """``--only-folder``'s section: the folder rows under their table head."""
    return "| measure | kubectl | reloadd | kubectl / reloadd |\n|---|---|---|---|\n" + folder_row(r) + "\n"


def markdown(r: dict[str, Any]) -> str:
    """The docs/benchmarks.md section for one run."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = [
        f"## kube-manifests vs kubectl ({when}, real kube-apiserver v1.20.2)",
        "",
        f"{r['files']} files of {r['objects_per_file']} objects (ConfigMaps, Secrets, a ServiceAccount, a Role, "
        "a Service), same server, separate namespaces; kubectl is one `kubectl apply --server-side -f FILE` "
        "process per file, reloadd's consumer one file per batch.",
        "",
        "| measure | kubectl | reloadd | kubectl / reloadd (median of per-file ratios) |",
        "|---|---|---|---|",
    ]
    for phase in ("create", "update"):
        rows.append(
            f"| {phase}, per file, median / p90 | {r[f'{phase}_kubectl_median_ms']:.0f} / "
            f"{r[f'{phase}_kubectl_p90_ms']:.0f} ms | {r[f'{phase}_reloadd_median_ms']:.0f} / "
            f"{r[f'{phase}_reloadd_p90_ms']:.0f} ms | **{r[f'{phase}_median_ratio_kubectl_over_reloadd']:.2f}** |"
        )
    rows.append(
        f"| all {r['files']} files | {r['create_kubectl_total_s']:.1f} s (loop, create) | "
        f"{r['one_batch_all_files_s']:.1f} s (one batch, start-up pass) | "
        f"{r['create_kubectl_total_s'] / r['one_batch_all_files_s']:.1f} |"
    )
    rows.append(
        f"| save → object visible (engine, quiet {r['quiet']}), median / p90, {r['saves']} saves | — | "
        f"{r['save_to_visible_median_ms']:.0f} / {r['save_to_visible_p90_ms']:.0f} ms | — |"
    )
    if "folder_reloadd_median_s" in r:
        rows.append(folder_row(r))
    for extra in r.get("corpus_rows", []):
        rows.append(extra)
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.exit(0 if asyncio.run(main()) else 1)
