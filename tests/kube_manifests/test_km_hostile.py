"""Hostile input corpus for kube-manifests, driven through the real engine against the session cluster.

One folder per case under ``hostile/`` (see its README). Each case: a good
manifest is applied; the hostile file is dropped in; its record carries an error containing
the expected text; the good file's object stays; ConfigMaps named in ``applied.txt`` (good
documents beside broken ones) exist; and a good file dropped afterwards is applied.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from reloadd import Reloader, parse_config
from tests.kube.apiserver import KubeCluster
from tests.reliability import Reliability
from tests.waiting import until

pytestmark = pytest.mark.timeout(120)

CORPUS = Path(__file__).parent / "hostile"
CASES = sorted(p.name for p in CORPUS.iterdir() if p.is_dir())
META = ("expected.txt", "generate.txt", "applied.txt")


def configmap(name: str, ns: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns},
                       "data": {"v": name}}) + "\n"


def place(case: Path, root: Path, ns: str) -> Path:
    """Put the case's input into ``root`` (``NAMESPACE`` replaced); return the path its error must name."""
    target: Path | None = None
    for f in sorted(case.iterdir()):
        if f.name not in META:
            target = root / f.name
            target.write_bytes(f.read_bytes().replace(b"NAMESPACE", ns.encode()))
    gen = case / "generate.txt"
    if gen.exists():
        kind, name, arg = gen.read_text().split()
        target = root / name
        n = int(arg)
        if kind == "fill":
            with open(target, "wb") as out:
                out.write(b"#" * n)  # one long comment: valid YAML, only too big
        elif kind == "nested-json":
            target.write_text("[" * n + "]" * n)
        elif kind == "nested-yaml":
            target.write_text(f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: deep, namespace: {ns}}}\n"
                              f"data: {{v: {'[' * n}{']' * n}}}\n")
        else:
            raise AssertionError(f"{gen}: unknown kind {kind!r}")
    assert target is not None, f"{case}: no input"
    return target


def exists(kube: KubeCluster, ns: str, name: str) -> bool:
    return kube.get(f"/api/v1/namespaces/{ns}/configmaps/{name}") is not None


@pytest.mark.parametrize("name", CASES)
async def test_hostile_manifest(tmp_path: Path, kube: KubeCluster, name: str, reliability: Reliability) -> None:
    case = CORPUS / name
    expected = (case / "expected.txt").read_text().strip()
    applied = (case / "applied.txt").read_text().split() if (case / "applied.txt").exists() else []
    ns = f"hostile-{uuid.uuid4().hex[:8]}"
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, f"/api/v1/namespaces/{ns}")
    root = tmp_path / "manifests"
    root.mkdir()
    (root / "00-good.yaml").write_text(configmap("before", ns))
    cfg = parse_config({
        "reloadd": {"state_dir": str(tmp_path / "state"), "quiet": "100ms"},
        "consumer": [{"name": "manifests", "plugin": "kube-manifests", "paths": [str(root)],
                      "options": {"kubeconfig": str(kube.kubeconfig)}}],
    })
    t0 = time.monotonic()
    async with Reloader(cfg) as r:
        await r.wait_idle(60)
        assert exists(kube, ns, "before")
        records: Any = r.engine.slots["manifests"].records
        target = place(case, root, ns)

        def reported() -> bool:
            rec = records.get(target)
            return rec is not None and bool(rec.error)

        await until(reported, timeout=60, what=f"an error for {target.name}")
        await r.wait_idle(60)
        error = records[target].error
        assert expected in error, error
        assert exists(kube, ns, "before")  # the rest keeps serving
        for cm in applied:
            assert exists(kube, ns, cm), cm  # good documents beside broken ones still applied
        (root / "zz-after.yaml").write_text(configmap("after", ns))
        await until(lambda: exists(kube, ns, "after"), timeout=60, what="a good file dropped afterwards")
        await r.wait_idle(60)
        after = int(exists(kube, ns, "after"))
    reliability.record(f"kube-manifests hostile input: {name}", trials=1, expected=1, delivered=after,
                       notes=f"`{expected}`; the good file dropped afterwards applied, the others kept serving; "
                             f"{time.monotonic() - t0:.1f}s")
