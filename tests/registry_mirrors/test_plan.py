"""``reloadd plan`` for registry-mirrors: the hosts.toml files the next real pass creates, updates, removes."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..planning import consumer_doc, planned, real_pass, run_plan, run_text_plan, tree, tree_changes, write_config
from .conftest import mirror_conf

pytestmark = pytest.mark.timeout(120)


def _setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    conf_d = tmp_path / "etc" / "registries.conf.d"
    conf_d.mkdir(parents=True)
    hosts = tmp_path / "certs.d"
    config = write_config(tmp_path, {
        "name": "mirrors", "plugin": "registry-mirrors", "paths": [],
        "options": {"registries_conf": str(tmp_path / "etc" / "registries.conf"), "registries_conf_d": str(conf_d),
                    "hosts_dir": str(hosts), "certs_dirs": [], "containerd_config": ""},
    })
    return config, conf_d, hosts


async def _plan_then_pass(config: Path, hosts: Path) -> tuple[set[tuple[str, str]], dict]:
    """Plan, run the real pass, and check the plan named exactly what the pass changed on disk."""
    rc, doc, err = await run_plan(config)
    changes = {(p, action) for p, action, _ in planned(doc, "mirrors")}
    assert rc == (2 if changes else 0), err
    before = tree(hosts, "hosts.toml")
    await real_pass(config)
    assert tree_changes(before, tree(hosts, "hosts.toml")) == changes
    rc, again, err = await run_plan(config)
    assert rc == 0, err
    assert consumer_doc(again, "mirrors")["status"] == "unchanged"
    return changes, doc


async def test_plan_matches_the_real_pass(tmp_path: Path) -> None:
    config, conf_d, hosts = _setup(tmp_path)
    (conf_d / "10-a.conf").write_text(mirror_conf("a.example.com", "127.0.0.1:5001"))
    (conf_d / "20-b.conf").write_text(mirror_conf("b.example.com", "127.0.0.1:5002"))
    a, b, c = (str(hosts / h / "hosts.toml") for h in ("a.example.com", "b.example.com", "c.example.com"))

    changes, doc = await _plan_then_pass(config, hosts)
    assert changes == {(a, "create"), (b, "create")}
    (created,) = consumer_doc(doc, "mirrors")["changes"][a]
    assert created["diff"].startswith("--- /dev/null")
    assert any(ln.startswith("+") and "127.0.0.1:5001" in ln for ln in created["diff"].splitlines())

    (conf_d / "10-a.conf").write_text(mirror_conf("a.example.com", "127.0.0.1:5011"))
    (conf_d / "20-b.conf").unlink()
    (conf_d / "30-c.conf").write_text(mirror_conf("c.example.com", "127.0.0.1:5003"))
    foreign = hosts / "d.example.com"
    foreign.mkdir()
    (foreign / "hosts.toml").write_text('server = "https://d.example.com"\n')  # not ours: left alone
    (conf_d / "40-d.conf").write_text(mirror_conf("d.example.com", "127.0.0.1:5004"))
    rc, text = await run_text_plan(config)
    assert rc == 2
    assert f"update {a}" in text and f"remove {b}" in text and f"create {c}" in text
    assert "d.example.com" not in text

    changes, doc = await _plan_then_pass(config, hosts)
    assert changes == {(a, "update"), (b, "remove"), (c, "create")}
    (updated,) = consumer_doc(doc, "mirrors")["changes"][a]
    minus = [ln for ln in updated["diff"].splitlines() if ln.startswith("-") and not ln.startswith("---")]
    plus = [ln for ln in updated["diff"].splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert any("5001" in ln for ln in minus) and any("5011" in ln for ln in plus)
    assert (foreign / "hosts.toml").read_text() == 'server = "https://d.example.com"\n'


async def test_a_broken_input_fails_the_plan_naming_it_as_the_pass_writes_nothing(tmp_path: Path) -> None:
    config, conf_d, hosts = _setup(tmp_path)
    (conf_d / "10-a.conf").write_text(mirror_conf("a.example.com", "127.0.0.1:5001"))
    await _plan_then_pass(config, hosts)
    (conf_d / "10-a.conf").write_text(mirror_conf("a.example.com", "127.0.0.1:5009"))
    broken = conf_d / "20-broken.conf"
    broken.write_text("[[registry]\n")
    rc, doc, err = await run_plan(config)
    assert rc == 1, err  # a CI job gating on the plan stops here
    mirrors = consumer_doc(doc, "mirrors")
    assert mirrors["status"] == "invalid" and doc["exit_code"] == 1
    (entry,) = mirrors["invalid"]
    assert entry["path"] == str(broken) and "invalid TOML" in entry["error"] and "would write nothing" in entry["error"]
    rc, text = await run_text_plan(config)
    assert rc == 1 and f"INVALID {broken}" in text
    before = tree(hosts, "hosts.toml")
    await real_pass(config)
    assert tree(hosts, "hosts.toml") == before, "the pass wrote something after all"


async def test_a_lost_drop_in_folder_plans_held_removals_not_removals(tmp_path: Path) -> None:
    config, conf_d, hosts = _setup(tmp_path)
    (conf_d / "10-a.conf").write_text(mirror_conf("a.example.com", "127.0.0.1:5001"))
    (conf_d / "20-b.conf").write_text(mirror_conf("b.example.com", "127.0.0.1:5002"))
    await _plan_then_pass(config, hosts)
    conf_d.rename(tmp_path / "away")  # an unmounted volume: the next pass holds, so the plan must not say "remove"
    rc, doc, err = await run_plan(config)
    assert rc == 0, err
    mirrors = consumer_doc(doc, "mirrors")
    assert mirrors["status"] == "unchanged"
    assert {(p, c["action"]) for p, cs in mirrors["changes"].items() for c in cs} == {
        (str(conf_d / "10-a.conf"), "held"), (str(conf_d / "20-b.conf"), "held")}
    rc, text = await run_text_plan(config)
    assert rc == 0 and f"HELD {conf_d / '10-a.conf'}: root {conf_d} disappeared" in text and "remove" not in text
    before = tree(hosts, "hosts.toml")
    await real_pass(config)
    assert tree(hosts, "hosts.toml") == before, "the pass removed what the plan said it would hold"
