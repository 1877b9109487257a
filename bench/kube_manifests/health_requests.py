"""Benchmark: the API requests health tracking adds, for 500 objects (issue #59: none beyond the watch).

    python -m bench.kube_manifests.health_requests [--files 50] [--objects 10] [--idle 10] [--md out.md]

A private kube-apiserver v1.20.2 with an audit log; a folder of ``000-ns.yaml`` and ``--files`` files of
``--objects`` ConfigMaps; the daemon (``Reloader``, kube-manifests at its defaults, health on as always)
started on it. Counted from the audit log, by verb and resource, the requests of reloadd's user: during
the first pass until every file is Current (reloadd's own status), then during ``--idle`` seconds of
idleness (watches are taken from the consumer's own count: the audit log writes a watch when it ends).
Health is read from the list+watch the consumer keeps on its objects: no GET per object, no
poll, so the idle window must show nothing but the watches it holds open.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import reloadd
from tests.kube.apiserver import KubeCluster

from .__main__ import namespace_folder
from ._output import emit

NS = "health-bench"


def _requests(kube: KubeCluster, since: int, ns: str) -> tuple[int, collections.Counter[str]]:
    """Lines of the audit log read so far, and the requests of non-system users after line ``since`` by
    ``verb resource`` (a watch counted when it starts): the folder's objects (in ``ns`` or the Namespace
    itself), the ApplySet parents (ConfigMaps elsewhere), discovery (no object)."""
    lines = kube.audit_log.read_text().splitlines()
    out: collections.Counter[str] = collections.Counter()
    for line in lines[since:]:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        user = (e.get("user") or {}).get("username", "")
        watch = e.get("verb") == "watch"
        if user.startswith("system:") or e.get("stage") != ("ResponseStarted" if watch else "ResponseComplete"):
            continue
        ref = e.get("objectRef") or {}
        if not ref.get("resource"):
            out[f"{e['verb']} discovery"] += 1
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        own = ref.get("namespace") == ns or (ref["resource"] == "namespaces" and ref.get("name") == ns)
        out[f"{e['verb']} {resource}" + ("" if own or ref["resource"] != "configmaps" else " (ApplySet parents)")] += 1
    return len(lines), out


async def run(files: int, objects: int, idle: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="reloadd-bench-health-"))
    try:
        async with KubeCluster(controllers=(), audit=True) as kube:
            root = work / "manifests"
            namespace_folder(root, NS, files, objects)
            cfg = reloadd.parse_config({
                "reloadd": {"state_dir": str(work / "state"), "quiet": "100ms"},
                "consumer": [{"name": "manifests", "plugin": "kube-manifests", "paths": [str(root)],
                              "options": {"kubeconfig": str(kube.kubeconfig)}}],
            })
            start, _ = await asyncio.to_thread(_requests, kube, 0, NS)
            t0 = time.perf_counter()
            async with reloadd.Reloader(cfg) as r:
                await r.wait_idle(300)
                while True:
                    health = r.status()["consumers"]["manifests"]["health"]
                    if not health["files"] and health["objects"].get("current", 0) >= files * objects + 1:
                        break
                    await asyncio.sleep(0.01)
                current_s = time.perf_counter() - t0
                await asyncio.sleep(0.5)  # the audit log is written after the response
                mid, first = await asyncio.to_thread(_requests, kube, start, NS)
                await asyncio.sleep(idle)
                _, quiet = await asyncio.to_thread(_requests, kube, mid, NS)
                objects_health = dict(health["objects"])
                stats = {k: v for k, v in r.snapshot().consumers[0].stats.items() if k.startswith("watch_")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"files": files + 1, "objects": files * objects + 1, "first_pass_to_current_s": round(current_s, 2),
            "health_objects": objects_health, "first_pass": dict(sorted(first.items())),
            "idle_s": idle, "idle": dict(sorted(quiet.items())), "watch_stats": stats}


def markdown(r: dict[str, Any]) -> str:
    """The docs/benchmarks.md rows."""
    first = ", ".join(f"{k} {v}" for k, v in r["first_pass"].items())
    idle = ", ".join(f"{k} {v}" for k, v in r["idle"].items()) or "none"
    gets = sum(v for k, v in r["first_pass"].items() if k == "get configmaps")
    w = r["watch_stats"]
    watches = (f"; watches held open: {w.get('watch_watches', 0):.0f} (the consumer's count: the audit log writes a "
               "watch when it ends)")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return "\n".join([
        f"## kube-manifests: the API requests health tracking adds ({when}, kube-apiserver v1.20.2, audit log)",
        "",
        "Health is read from the list+watch the consumer keeps on its objects (the drift source's): no GET per "
        "object, no poll. Requests of reloadd's user by verb and resource.",
        "",
        "| measure | kubectl | reloadd | note |",
        "|---|---|---|---|",
        f"| API requests of reloadd, first pass of {r['objects']} objects in {r['files']} files until all Current "
        f"({r['first_pass_to_current_s']:.1f} s; audit log) | — | {first}{watches} | GETs of the objects: {gets} |",
        f"| API requests of reloadd over {r['idle_s']:.0f} s idle, {r['objects']} objects Current | — | {idle} | "
        "health adds none beyond the watch |",
        "",
    ]) + "\n"


async def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.kube_manifests.health_requests",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=50)
    ap.add_argument("--objects", type=int, default=10)
    ap.add_argument("--idle", type=float, default=10.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args(argv)
    result = await run(args.files, args.objects, args.idle)
    emit(result, args.json, args.md, markdown)
    return result


if __name__ == "__main__":
    sys.exit(0 if asyncio.run(main()) else 1)
