"""The Python floor of the folder first pass: the same 1,001 server-side applies and nothing else.

The folder benchmark (phase 5 of ``python -m bench.kube_manifests``) compares reloadd's first pass against
``kubectl apply --server-side -f DIR``. This client says how far down a Python process can go on the same
machine: reloadd's own :class:`KubeClient` (its HTTP/1.1 keep-alive pool, JSON, headers), the same number of
requests in flight as the consumer's ``parallel``, and only the object PATCHes (the Namespace first, then the
ConfigMaps): no engine, no file reads or parsing, no discovery, no ApplySet parent, no watch, no health.
If this floor is above half of kubectl's time, reloadd's ≤ 0.5× cannot be reached on this machine by
cutting reloadd's own work.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import yaml
from reloadd_kube_manifests import KubeClient
from reloadd_kube_manifests._kubeconfig import load_cluster_config

__all__ = ["floor_pass"]


def _url(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    if obj["kind"] == "Namespace":
        return f"/api/v1/namespaces/{meta['name']}"
    return f"/api/v1/namespaces/{meta['namespace']}/configmaps/{meta['name']}"


def _read(root: Path) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(root.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


async def floor_pass(kubeconfig: Path, root: Path, in_flight: int = 8) -> float:
    """Seconds to apply every object of the folder ``root`` (read beforehand, not timed), ``in_flight`` at once.

    Raises:
        ApiError: when the server refuses an apply.
    """
    docs = await asyncio.to_thread(_read, root)
    namespaces = [d for d in docs if d["kind"] == "Namespace"]
    rest = [d for d in docs if d["kind"] != "Namespace"]
    client = KubeClient(await asyncio.to_thread(load_cluster_config, kubeconfig, None), user_agent="reloadd-floor")
    sem = asyncio.Semaphore(in_flight)

    async def one(obj: dict[str, Any]) -> None:
        async with sem:
            await client.apply(_url(obj), obj, manager="reloadd-floor", force=True, dry_run=False)

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(d) for d in namespaces))
        await asyncio.gather(*(one(d) for d in rest))
        return time.perf_counter() - t0
    finally:
        await client.close()
