"""``reloadd plan`` for containerd-images: the image records the next real pass creates, repoints, unpins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.infra import Containerd, ImageSpec, local_registry, push_image, write_docker_archive, write_oci_archive

from ..planning import consumer_doc, real_pass, run_plan, run_text_plan, write_config
from ._helpers import dump

pytestmark = pytest.mark.timeout(180)


async def _records(ctd: Containerd) -> dict[str, Any]:
    """Image record name → (target digest, labels), in the CRI namespace."""
    d = await dump(ctd.address, "k8s.io")
    return {name: (digest, d["labels"][name]) for name, _, digest, _ in d["images"]}


def _record_changes(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    return {r for r in before.keys() | after.keys() if before.get(r) != after.get(r)}


def _planned_refs(doc: Any) -> set[str]:
    """Every record the plan says would change: an entry's ``refs`` detail, or its target."""
    changes = consumer_doc(doc, "images")["changes"]
    return {r for cs in changes.values() for c in cs for r in (c.get("detail") or {}).get("refs", [c["target"]])}


async def _plan_then_pass(config: Path, ctd: Containerd) -> Any:
    rc, doc, err = await run_plan(config)
    planned = _planned_refs(doc)
    assert rc == (2 if planned else 0), err
    before = await _records(ctd)
    await real_pass(config, timeout=120)
    assert _record_changes(before, await _records(ctd)) == planned
    rc, again, err = await run_plan(config)
    assert rc == 0, err
    assert consumer_doc(again, "images")["status"] == "unchanged"
    return doc


def _setup(tmp_path: Path, address: str, **options: str) -> tuple[Path, Path]:
    """An images folder holding ``a.tar`` (example.com/a:v1), and a config watching it."""
    images = tmp_path / "images"
    images.mkdir()
    write_oci_archive(images / "a.tar", [ImageSpec("example.com/a:v1", seed="a1")])
    config = write_config(tmp_path, {"name": "images", "plugin": "containerd-images", "paths": [str(images)],
                                     "options": {"address": address, **options}})
    return images, config


def _actions(doc: Any) -> set[tuple[str, str, str]]:
    changes = consumer_doc(doc, "images")["changes"]
    return {(Path(p).name, c["action"], c["target"]) for p, cs in changes.items() for c in cs}


async def test_plan_matches_the_real_pass(ctd: Containerd, tmp_path: Path) -> None:
    images, config = _setup(tmp_path, ctd.address)
    write_docker_archive(images / "b.tar", [ImageSpec("docker.io/library/b:v1", seed="b1", layer_compression="none")])
    doc = await _plan_then_pass(config, ctd)
    assert _actions(doc) == {("a.tar", "import", "example.com/a:v1"), ("b.tar", "import", "docker.io/library/b:v1")}

    write_oci_archive(images / "a.tar", [ImageSpec("example.com/a:v1", seed="a2")])  # same name, new image
    (images / "b.tar").unlink()  # its records are unpinned (on_delete = "unpin")
    write_docker_archive(images / "c.tar", [ImageSpec("docker.io/library/c:v1", seed="c1")])
    rc, text = await run_text_plan(config)
    assert rc == 2 and "update example.com/a:v1" in text and "unpin docker.io/library/b:v1" in text
    doc = await _plan_then_pass(config, ctd)
    actions = _actions(doc)
    assert ("a.tar", "update", "example.com/a:v1") in actions
    assert ("c.tar", "import", "docker.io/library/c:v1") in actions
    assert ("b.tar", "unpin", "docker.io/library/b:v1") in actions
    assert any(a == "unpin" and t.startswith("example.com/a@sha256:") for p, a, t in actions)  # a's old digest


async def test_unreachable_containerd_exits_1(tmp_path: Path) -> None:
    _, config = _setup(tmp_path, str(tmp_path / "no.sock"), timeout="2s")
    rc, doc, err = await run_plan(config)
    assert rc == 1
    assert consumer_doc(doc, "images")["status"] == "error"
    assert "no.sock" in err


def _named(refs: set[str]) -> set[str]:
    """Records by image name (CRI adds ``repo@digest`` and config-id records of its own on a pull)."""
    return {r for r in refs if "@" not in r and not r.startswith("sha256:")}


async def test_list_plan_matches_the_real_pass(ctd: Containerd, tmp_path: Path) -> None:
    images, config = _setup(tmp_path, ctd.address)
    await real_pass(config)
    async with local_registry(tmp_path) as reg:
        src = tmp_path / "alpha.tar"
        write_oci_archive(src, [ImageSpec("example.com/alpha:v1", seed="alpha")])
        await push_image(src, f"{reg.host}/library/alpha:v1")
        alpha = f"{reg.host}/library/alpha:v1"
        lst = images / "prepull.txt"
        lst.write_text(f"{alpha}\nexample.com/a:v1  # present already: only relabelled\n")
        for expected in ({(alpha, "pull"), ("example.com/a:v1", "relabel")}, None):
            rc, doc, err = await run_plan(config)
            changes = consumer_doc(doc, "images")["changes"]
            planned = {(c["target"], c["action"]) for cs in changes.values() for c in cs}
            if expected is not None:
                assert planned == expected
            assert rc == (2 if planned else 0), err
            before = await _records(ctd)
            await real_pass(config)
            assert _named(_record_changes(before, await _records(ctd))) == _named(_planned_refs(doc))
            lst.unlink(missing_ok=True)  # then: alpha unpinned; a:v1 stays pinned, a.tar holds it
        assert planned == {(alpha, "unpin")}
        rc, doc, err = await run_plan(config)
        assert rc == 0 and consumer_doc(doc, "images")["status"] == "unchanged", err
