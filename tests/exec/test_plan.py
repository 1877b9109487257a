"""``reloadd plan`` with exec: it cannot plan, but lists exactly the paths the next pass hands over."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reloadd import Reloader, load_config

from ..planning import consumer_doc, pending, real_pass, run_plan, run_text_plan, write_config

pytestmark = pytest.mark.timeout(120)


def _hook(tmp_path: Path) -> tuple[Path, Path]:
    """A watched folder holding ``a.conf`` and a config with an exec consumer ``hook`` on it."""
    watched = tmp_path / "w"
    watched.mkdir()
    (watched / "a.conf").write_text("a\n")
    return watched, write_config(tmp_path, {"name": "hook", "plugin": "exec", "paths": [str(watched)],
                                            "options": {"command": ["true"]}})


def _batches(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []


async def test_exec_cannot_plan_but_lists_what_the_next_pass_hands_over(tmp_path: Path) -> None:
    watched = tmp_path / "w"
    watched.mkdir()
    log = tmp_path / "batches.jsonl"
    for name in ("modified.conf", "deleted.conf", "touched.conf", "same.conf"):
        (watched / name).write_text(f"{name}\n")
    (watched / "ignored.swp").write_text("editor droppings are not handed over\n")
    config = write_config(tmp_path, {
        "name": "hook", "plugin": "exec", "paths": [str(watched)],
        "options": {"command": ["sh", "-c", f"cat >> {log}; echo >> {log}"]},
    })
    await real_pass(config)
    assert len(_batches(log)) == 1
    log.unlink()

    (watched / "modified.conf").write_text("new content\n")
    (watched / "deleted.conf").unlink()
    st = os.stat(watched / "touched.conf")
    os.utime(watched / "touched.conf", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # times only: no change
    (watched / "added.conf").write_text("added\n")

    rc, doc, err = await run_plan(config)
    assert rc == 0, err  # exec cannot plan: it does not decide the exit code
    hook = consumer_doc(doc, "hook")
    assert hook["status"] == "cannot-plan" and "effects cannot be known" in hook["reason"]
    expected = {
        (str(watched / "modified.conf"), "modified"),
        (str(watched / "deleted.conf"), "deleted"),
        (str(watched / "added.conf"), "added"),
    }
    assert pending(doc, "hook") == expected
    rc, text = await run_text_plan(config)
    assert rc == 0 and "consumer hook (exec): cannot plan:" in text
    assert f"would hand over: deleted {watched / 'deleted.conf'}" in text

    await real_pass(config)
    handed = {(c["path"], c["kind"]) for b in _batches(log) for c in b["changes"]}
    assert handed == expected

    rc, doc, err = await run_plan(config)
    assert rc == 0, err
    assert pending(doc, "hook") == set()


async def test_plan_writes_no_state(tmp_path: Path) -> None:
    watched, config = _hook(tmp_path)
    rc, doc, err = await run_plan(config)
    assert rc == 0, err
    assert pending(doc, "hook") == {(str(watched / "a.conf"), "added")}
    assert not (tmp_path / "state").exists()


async def test_invalid_config_exits_1_naming_the_file(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[reloadd]\nquiet = 'soon'\n")
    rc, doc, err = await run_plan(config)
    assert rc == 1 and doc is None
    assert "bad.toml [reloadd]: key 'quiet'" in err
    config.write_text('[[consumer]]\nname = "x"\nplugin = "exec"\npaths = ["."]\n[consumer.options]\ncommand = []\n')
    rc, doc, err = await run_plan(config)
    assert rc == 1
    assert consumer_doc(doc, "x")["status"] == "error"
    assert "'command' must be a non-empty list" in err


async def test_exit_code_is_decided_by_the_consumers_that_can_plan(tmp_path: Path) -> None:
    watched = tmp_path / "w"
    conf_d = tmp_path / "registries.conf.d"
    watched.mkdir()
    conf_d.mkdir()
    (watched / "a.conf").write_text("a\n")
    mirrors = {"name": "mirrors", "plugin": "registry-mirrors", "paths": [],
               "options": {"registries_conf": str(tmp_path / "registries.conf"), "registries_conf_d": str(conf_d),
                           "hosts_dir": str(tmp_path / "certs.d"), "certs_dirs": [], "containerd_config": ""}}
    hook = {"name": "hook", "plugin": "exec", "paths": [str(watched)], "options": {"command": ["true"]}}
    config = write_config(tmp_path, hook, mirrors)
    rc, doc, err = await run_plan(config)
    assert rc == 0, err  # exec has a pending path, mirrors nothing to write
    assert [c["status"] for c in doc["consumers"]] == ["cannot-plan", "unchanged"]
    (conf_d / "10-a.conf").write_text('[[registry]]\nprefix = "a.example.com"\nlocation = "a.example.com"\n'
                                      '[[registry.mirror]]\nlocation = "127.0.0.1:5001"\ninsecure = true\n')
    rc, doc, err = await run_plan(config)
    assert rc == 2, err
    assert doc["changes"] is True and doc["exit_code"] == 2
    assert [c["status"] for c in doc["consumers"]] == ["cannot-plan", "changes"]


async def test_plan_beside_a_running_daemon(tmp_path: Path) -> None:
    """The daemon holds the state lock; plan reads its records anyway and leaves the state files alone."""
    watched, config = _hook(tmp_path)
    async with Reloader(load_config(config)) as daemon:
        await daemon.wait_idle(30)
        consumer_state = tmp_path / "state" / "consumers" / "hook"
        journal = next(consumer_state.glob("records.journal.*"))
        with open(journal, "a") as fh:
            fh.write('{"p": "/torn", "r"')  # a half-written line, as after a crash mid-append
        before = {p.name: p.read_bytes() for p in consumer_state.iterdir() if p.is_file()}
        rc, doc, err = await run_plan(config)
        assert rc == 0, err
        assert pending(doc, "hook") == set()  # the daemon's acknowledgement is read
        assert {p.name: p.read_bytes() for p in consumer_state.iterdir() if p.is_file()} == before
        (watched / "b.conf").write_text("b\n")
        rc, doc, err = await run_plan(config)  # may race the daemon: b.conf is pending or already handled
        assert rc == 0, err
        assert pending(doc, "hook") <= {(str(watched / "b.conf"), "added")}


async def test_a_plan_lists_held_removals_instead_of_handing_them_over(tmp_path: Path) -> None:
    watched = tmp_path / "w"
    watched.mkdir()
    for name in ("a.conf", "b.conf"):
        (watched / name).write_text(f"{name}\n")
    config = write_config(tmp_path, {"name": "hook", "plugin": "exec", "paths": [str(watched)],
                                     "options": {"command": ["true"]}})
    await real_pass(config)
    for name in ("a.conf", "b.conf"):
        (watched / name).unlink()  # emptied at once: prune safety holds both
    rc, doc, err = await run_plan(config)
    assert rc == 0, err
    assert pending(doc, "hook") == set()
    rc, text = await run_text_plan(config)
    assert f"HELD {watched / 'a.conf'}: every file under root {watched} went at once" in text
    assert "would hand over: deleted" not in text
