"""Order across files (``_gate``): what a file provides and needs, its wave, and the waiting itself. No cluster."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from reloadd_kube_manifests._gate import Gate, WaveError, needs, provides, wave_of
from reloadd_kube_manifests._manifests import Manifest, parse_manifest

pytestmark = pytest.mark.timeout(30)


def manifest(*objs: dict[str, Any]) -> Manifest:
    return parse_manifest("\n---\n".join(json.dumps(o) for o in objs).encode(), json_file=False, max_nodes=10_000)


NS = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "web"}}
CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
       "metadata": {"name": "widgets.example.com"},
       "spec": {"group": "example.com", "names": {"kind": "Widget", "plural": "widgets"}}}


def cm(name: str, ns: str = "web", wave: object = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if wave is not None:
        meta["annotations"] = {"reloadd.io/wave": wave}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}


def test_provides_and_needs() -> None:
    assert provides(manifest(NS, CRD)) == {("namespace", "web"), ("kind", "example.com/Widget")}
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "namespace": "web"}}
    assert needs(manifest(cm("a"), widget)) == {("namespace", "web"), ("kind", "/ConfigMap"),
                                                ("kind", "example.com/Widget")}
    # What a file creates itself it does not wait for (its own apply ranks it first).
    assert ("namespace", "web") not in needs(manifest(NS, cm("a")))


@pytest.mark.parametrize(("waves", "expected"), [((), 0), ((None, None), 0), (("1", None), 1), ((-1, "2"), 2),
                                                 (("-3",), -3), ((" 4 ",), 4)])
def test_a_file_goes_in_its_highest_wave(waves: tuple[object, ...], expected: int) -> None:
    assert wave_of(manifest(*(cm(f"c{i}", wave=w) for i, w in enumerate(waves)))) == expected


def test_a_wave_that_is_not_an_integer_names_the_object() -> None:
    with pytest.raises(WaveError, match=r"doc 2 .*ConfigMap: annotation reloadd.io/wave must be an integer, got 'x'"):
        wave_of(manifest(cm("a"), cm("b", wave="x")))


async def test_a_waiter_goes_on_when_its_provider_is_done_and_a_provider_never_waits() -> None:
    gate = Gate(timeout=10)
    ns_file, cms = Path("/m/zz-ns.yaml"), Path("/m/a.yaml")
    gate.expect(ns_file, {("namespace", "web")})
    assert gate.providing(ns_file)
    assert not await gate.wait(ns_file, {("namespace", "web")})  # a provider never waits
    waiter = asyncio.create_task(gate.wait(cms, {("namespace", "web"), ("kind", "/ConfigMap")}))
    await asyncio.sleep(0)  # let it start waiting: nothing else to await
    assert not waiter.done()
    gate.done(ns_file)
    assert await asyncio.wait_for(waiter, 5) is True
    assert gate.waited == 1 and not gate.providing(ns_file)
    assert not await gate.wait(cms, {("namespace", "web")})  # nothing pending any more


async def test_a_waiter_gives_up_after_the_timeout() -> None:
    gate = Gate(timeout=0.05)
    gate.expect(Path("/m/ns.yaml"), {("namespace", "web")})
    assert await asyncio.wait_for(gate.wait(Path("/m/a.yaml"), {("namespace", "web")}), 5) is True
