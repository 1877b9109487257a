"""Prune safety (#21) against the real kube-apiserver: a lost folder or an outsized prune deletes nothing unasked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from reloadd_kube_manifests import parent_name

import reloadd
from tests.waiting import until

from .support import KubeCluster, cm
from .test_km_moves import running, uids
from .test_km_reloader import write_atomic

pytestmark = pytest.mark.timeout(150)

CONSUMER = "manifests"
PARENTS = "/api/v1/namespaces/kube-system"


def config(kube: KubeCluster, tmp_path: Path, root: Path, **options: Any) -> reloadd.Config:
    return reloadd.parse_config({
        "reloadd": {"state_dir": str(tmp_path / "state"), "quiet": "50ms", "rescan_interval": "200ms"},
        "consumer": [{
            "name": CONSUMER, "plugin": "kube-manifests", "paths": [str(root)],
            "options": {"kubeconfig": str(kube.kubeconfig), **options},
        }],
    })


def objects(namespace: str, *names: str) -> dict[str, str]:
    return {n: f"/api/v1/namespaces/{namespace}/configmaps/{n}" for n in names}


def versions(kube: KubeCluster, objs: dict[str, str]) -> dict[str, str | None]:
    return {k: (kube.get(u) or {}).get("metadata", {}).get("resourceVersion") for k, u in objs.items()}


def held(r: reloadd.Reloader) -> list[dict[str, Any]]:
    return list(r.status()["consumers"][CONSUMER]["prune_held"])


async def rescans(r: reloadd.Reloader, n: int = 5) -> None:
    start = r.engine.stats.rescans
    await until(lambda: r.engine.stats.rescans >= start + n, what=f"{n} rescans")


def held_events(kube: KubeCluster, rel: str) -> list[dict[str, Any]]:
    parent = parent_name(f"{CONSUMER}:{rel}")
    items = (kube.get(f"{PARENTS}/events") or {}).get("items") or []
    return [e for e in items if e.get("reason") == "PruneHeld" and e["involvedObject"]["name"] == parent]


async def test_a_lost_manifests_folder_deletes_nothing_and_coming_back_recreates_nothing(
        kube: KubeCluster, tmp_path: Path, namespace: str) -> None:
    root = tmp_path / "manifests"
    root.mkdir()
    names = ("a1", "a2", "b1", "c1")
    write_atomic(root / "a.yaml", [cm("a1", namespace), cm("a2", namespace)])
    write_atomic(root / "b.yaml", [cm("b1", namespace)])
    write_atomic(root / "c.yaml", [cm("c1", namespace)])
    objs = objects(namespace, *names)
    async with running(config(kube, tmp_path, root)) as r:
        before, rv = uids(kube, objs), versions(kube, objs)
        assert all(before.values())

        root.rename(tmp_path / "away")  # the volume went away
        await until(lambda: len(held(r)) == 3, what="3 removals held")
        await rescans(r)
        assert uids(kube, objs) == before, "objects were deleted while their folder was lost"
        assert sum(h["size"] for h in held(r)) == 4 and r.status()["consumers"][CONSUMER]["prune_held_unit"] == \
            "objects"
        await until(lambda: bool(held_events(kube, "a.yaml")), what="a Warning Event on a.yaml's parent")
        assert held_events(kube, "a.yaml")[0]["type"] == "Warning"

        (tmp_path / "away").rename(root)
        await until(lambda: not held(r), what="the hold released")
        await r.wait_idle(30)
        assert uids(kube, objs) == before and versions(kube, objs) == rv, "the folder came back: nothing re-applied"

        for f in root.iterdir():
            f.unlink()  # rm -rf manifests/*
        await until(lambda: len(held(r)) == 3, what="held again")
        await rescans(r)
        assert uids(kube, objs) == before
        assert await r.confirm_prune() == 3
        await until(lambda: not any(uids(kube, objs).values()), what="the confirmed removals")
        await r.wait_idle(30)
        assert not held(r)


async def test_a_pass_over_max_prune_is_held_and_one_below_it_prunes(
        kube: KubeCluster, tmp_path: Path, namespace: str) -> None:
    root = tmp_path / "manifests"
    root.mkdir()
    for f in "abc":
        write_atomic(root / f"{f}.yaml", [cm(f"{f}1", namespace), cm(f"{f}2", namespace)])
    write_atomic(root / "d.yaml", [cm("d1", namespace)])  # the folder is not emptied
    objs = objects(namespace, "a1", "a2", "b1", "b2", "c1", "c2", "d1")
    async with running(config(kube, tmp_path, root, max_prune=3, move_grace="0s")) as r:
        before = uids(kube, objs)
        (root / "a.yaml").unlink()  # 2 objects: below the limit
        await until(lambda: kube.get(objs["a1"]) is None and kube.get(objs["a2"]) is None, what="a.yaml pruned")
        assert not held(r)

        (root / "b.yaml").unlink()
        (root / "c.yaml").unlink()  # 4 more objects in the same pass: over max_prune (3)
        await until(lambda: len(held(r)) == 2, what="b and c held")
        assert "over max_prune (3)" in held(r)[0]["why"]
        await rescans(r)
        kept = {k: v for k, v in before.items() if k[0] in "bcd"}
        assert {k: v for k, v in uids(kube, objs).items() if k[0] in "bcd"} == kept

        assert await r.confirm_prune(CONSUMER) == 2
        await until(lambda: all(kube.get(objs[k]) is None for k in ("b1", "b2", "c1", "c2")),
                    what="the confirmed removals")
        await r.wait_idle(30)
        assert uids(kube, objs)["d1"] == before["d1"] and not held(r)
