"""Pure parts: manifest parsing, ApplySet naming, ordering and option validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from reloadd_kube_manifests import Settings, applyset_id, create, parent_name, parse_manifest
from reloadd_kube_manifests._ordering import sort_for_apply, sort_for_delete

from reloadd import ConfigError, ConsumerContext

pytestmark = pytest.mark.timeout(30)


def test_applyset_id_matches_kubectl() -> None:
    # The value kubectl 1.32 computed for parent configmaps/reloadd-a in namespace default.
    assert applyset_id("reloadd-a", "default") == "applyset-lAkygGgVKSPPnBD_isTDC3Q2fsfUZD3_4b0rwJhRO2A-v1"


def test_parent_names_are_valid_and_distinct_for_same_basenames() -> None:
    a, b = parent_name("m:team-a/my_app.yaml"), parent_name("m:team-b/my_app.yaml")
    assert a != b
    assert a.startswith("reloadd-my-app-yaml-") and len(a) <= 63
    assert parent_name("m:" + "Ü" * 300 + ".yaml").startswith("reloadd-yaml-")


def test_yaml_stream_lists_empty_documents_and_strings_kept() -> None:
    text = """\
---
# a comment-only document is dropped
---
apiVersion: v1
kind: ConfigMapList
items:
- {apiVersion: v1, kind: ConfigMap, metadata: {name: a, resourceVersion: "5", managedFields: []}}
- {apiVersion: v1, kind: ConfigMap, metadata: {name: b}, data: {when: 2024-01-01, yes: on}}
---
---
apiVersion: v1
kind: Namespace
metadata: {name: n}
"""
    m = parse_manifest(text.encode())
    assert m.errors == []
    assert [(o.doc, o.item, o.name) for o in m.objects] == [(1, 0, "a"), (1, 1, "b"), (2, None, "n")]
    assert m.objects[0].body["metadata"] == {"name": "a"}  # server-owned fields stripped
    assert m.objects[1].body["data"] == {"when": "2024-01-01", True: True}
    assert m.objects[2].line == 11


def test_json_file_and_its_errors() -> None:
    good = parse_manifest(json.dumps({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}).encode(),
                          json_file=True)
    assert [o.kind for o in good.objects] == ["Secret"]
    bad = parse_manifest(b'{"apiVersion": "v1",\n "kind": }', json_file=True)
    assert len(bad.errors) == 1 and bad.errors[0].line == 2 and "JSON error" in bad.errors[0].message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: &a [*a]\n", "recursive alias"),
        ("x: " + "[" * 300 + "]" * 300 + "\n", "nested deeper than 200 levels"),
        ("kind: ConfigMap\nmetadata: {name: x}\n", "missing apiVersion"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n", "missing metadata.name"),
        (b"\xff\xfe".decode("latin-1"), "expected an object"),
        ("apiVersion: v1\nkind: [\n", "YAML error at line 3"),
    ],
)
def test_bad_documents_are_reported_not_raised(text: str, message: str) -> None:
    m = parse_manifest(text.encode())
    assert m.objects == []
    assert len(m.errors) == 1 and message in m.errors[0].message, m.errors


def test_invalid_utf8_is_a_document_error() -> None:
    m = parse_manifest(b"apiVersion: v1\nkind: \xff\n")
    assert "not UTF-8" in m.errors[0].message


def test_apply_order_puts_crds_and_namespaces_first_and_deletes_reverse() -> None:
    items = [("", "ConfigMap"), ("example.com", "Widget"), ("", "Namespace"),
             ("apiextensions.k8s.io", "CustomResourceDefinition"), ("apps", "Deployment")]
    ordered = sort_for_apply(items, lambda x: x)
    assert ordered[:3] == [("apiextensions.k8s.io", "CustomResourceDefinition"), ("", "Namespace"),
                           ("", "ConfigMap")]
    assert ordered[3:] == [("example.com", "Widget"), ("apps", "Deployment")]  # file order kept
    assert sort_for_delete(items, lambda x: x)[-2:] == ordered[1::-1]


def ctx(tmp_path: Path, **options: Any) -> ConsumerContext:
    return ConsumerContext(name="m", paths=(tmp_path,), options=options, state_dir=tmp_path,
                           config_file=tmp_path / "reloadd.toml")


def test_options_defaults_and_validation(tmp_path: Path) -> None:
    consumer = create(ctx(tmp_path, kubeconfig="kc.yaml"))
    s = consumer.settings
    assert s == Settings(kubeconfig=tmp_path / "kc.yaml")
    assert (s.field_manager, s.force, s.namespace, s.prune, s.dry_run) == (
        "reloadd", True, "kube-system", True, False)
    with pytest.raises(ConfigError, match="unknown key\\(s\\) 'forse'"):
        create(ctx(tmp_path, forse=False))
    with pytest.raises(ConfigError, match="'force' must be a boolean"):
        create(ctx(tmp_path, force="yes"))


async def test_claims_spare_what_another_file_wants_and_make_it_wait_for_a_delete_pass() -> None:
    import asyncio

    from reloadd_kube_manifests._applyset import ObjRef
    from reloadd_kube_manifests._claims import Claims

    a, b, c = (ObjRef("", "ConfigMap", "ns", n) for n in "abc")
    claims = Claims()
    await claims.want("new", {a})
    with claims.deleting("old", [a, b], lambda r: r, keep={c}) as doomed:
        assert doomed == [b]  # a is wanted by "new"
        waiter = asyncio.create_task(claims.want("other", {b, c}))
        await asyncio.sleep(0)
        assert not waiter.done(), "an apply of b went ahead while b was being deleted"
    await asyncio.wait_for(waiter, 1)
    claims.forget("new")
    with claims.deleting("old", [a, b], lambda r: r) as doomed:
        assert doomed == [a]


def test_move_grace_option(tmp_path: Path) -> None:
    assert create(ctx(tmp_path)).settings.move_grace == 5.0
    assert create(ctx(tmp_path, move_grace="500ms")).settings.move_grace == 0.5
    assert create(ctx(tmp_path, move_grace="0s")).settings.move_grace == 0.0
    with pytest.raises(ConfigError, match="move_grace"):
        create(ctx(tmp_path, move_grace="-1s"))


async def test_move_grace_waits_until_the_objects_have_another_file_or_the_window_ends() -> None:
    import asyncio

    from reloadd_kube_manifests._applyset import ObjRef
    from reloadd_kube_manifests._moves import MoveGrace

    a, b = (ObjRef("", "ConfigMap", "ns", n) for n in "ab")
    old, gone = Path("/m/dir/app.yaml"), Path("/m/gone.yaml")
    now = [100.0]
    woken: list[Path] = []
    wake = asyncio.Event()

    def trigger(paths: Any) -> None:
        woken.extend(paths)
        wake.set()

    moves = MoveGrace(60.0, trigger, clock=lambda: now[0])
    assert moves.wait_for(old, "m:dir/app.yaml", set(), set()) == 0.0, "an empty set has nothing to wait for"
    assert moves.wait_for(old, "m:dir/app.yaml", {a, b}, {a, b}) == 0.0, "everything has another file already"
    assert old not in moves
    assert moves.wait_for(old, "m:dir/app.yaml", {a, b}, {a}) == 60.0
    now[0] += 20
    assert moves.wait_for(old, "m:dir/app.yaml", set(), {a}) == 40.0, "the window runs from the first call"
    moves.adopted(lambda key: {a})
    assert not woken, "woken although b has no other file"
    moves.adopted(lambda key: {a, b})
    assert woken == [old]
    assert moves.wait_for(old, "m:dir/app.yaml", set(), {a, b}) == 0.0
    moves.done(old)
    assert old not in moves

    short = MoveGrace(0.01, trigger)
    wake.clear()
    assert short.wait_for(gone, "m:gone.yaml", {a}, set()) > 0
    await asyncio.wait_for(wake.wait(), 5)  # the timer asks for the path again when the window ends
    assert woken[-1] == gone and short.wait_for(gone, "m:gone.yaml", set(), set()) == 0.0
    assert MoveGrace(0.0, trigger).wait_for(gone, "m:gone.yaml", {a}, set()) == 0.0, "0 disables waiting"
    moves.close()
    short.close()


async def test_reading_a_small_manifest_allocates_what_it_holds_not_the_size_limit(tmp_path: Path) -> None:
    # Regression: the whole max_file_size (5 MiB) was allocated (and mapped, and unmapped) for every file
    # read, whatever it held: the largest Python allocation of a daemon's start-up pass over small files.
    import tracemalloc

    from reloadd_kube_manifests import load_manifest

    p = tmp_path / "cm.yaml"
    p.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: small\n")
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        manifest = await load_manifest(p, max_bytes=5 * 1024 * 1024)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert [o.body["metadata"]["name"] for o in manifest.objects] == ["small"]
    assert peak < 1024 * 1024, f"reading a 60-byte manifest peaked at {peak} bytes"


async def test_a_manifest_is_read_whole_up_to_the_limit_even_when_it_grew_after_the_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from reloadd_kube_manifests import ManifestError, _manifests, load_manifest

    text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: grown\n"
    p = tmp_path / "cm.yaml"
    p.write_text(text)
    assert [o.body["metadata"]["name"] for o in (await load_manifest(p, max_bytes=len(text))).objects] == ["grown"]
    with pytest.raises(ManifestError, match="larger than"):
        await load_manifest(p, max_bytes=len(text) - 1)

    real = os.fstat

    class Shrunk:  # the stat as it was before the writer appended
        def __init__(self, st: os.stat_result) -> None:
            self.st_size = 8
            self.st_mode = st.st_mode

    monkeypatch.setattr(_manifests.os, "fstat", lambda fd: Shrunk(real(fd)))
    assert [o.body["metadata"]["name"] for o in (await load_manifest(p, max_bytes=len(text))).objects] == ["grown"]
    with pytest.raises(ManifestError, match="larger than"):
        await load_manifest(p, max_bytes=len(text) - 1)
