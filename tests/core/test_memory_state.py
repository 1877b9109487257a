"""``state_dir = ""`` (or ``None``) keeps state in memory; configured paths are normalised."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from reloadd import Reloader, parse_config

pytestmark = pytest.mark.timeout(60)


def test_empty_state_dir_means_in_memory():
    assert parse_config({"reloadd": {"state_dir": ""}}).state_dir is None
    assert parse_config({"reloadd": {}}).state_dir == Path("/var/lib/reloadd")


def test_paths_with_dotdot_are_normalised(tmp_path):
    source = tmp_path / "etc" / "reloadd.toml"
    cfg = parse_config({
        "reloadd": {"state_dir": "/var/lib/../lib/reloadd/./x/..", "control_socket": "../run/ctl.sock"},
        "consumer": [{"name": "c", "plugin": "exec", "paths": ["conf.d/../other", "/srv/a/../b"]}],
    }, source=source)
    assert cfg.state_dir == Path("/var/lib/reloadd")
    assert cfg.control_socket == tmp_path / "run" / "ctl.sock"
    assert cfg.consumers[0].paths == (tmp_path / "etc" / "other", Path("/srv/b"))


async def test_in_memory_state_persists_nothing(tmp_path, recorder_cls):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.conf").write_text("a")
    cfg = parse_config({
        "reloadd": {"state_dir": "", "quiet": "100ms"},
        "consumer": [{"name": "hook", "plugin": "exec", "paths": [str(root)],
                      "options": {"command": ["true"]}}],
    })
    for _ in range(2):  # nothing remembered: the second reloader is handed the file again
        rec = recorder_cls([root])
        async with Reloader(cfg, consumers=[rec]) as r:
            await r.wait_idle(10)
            assert len(rec.changes_for(root / "a.conf")) == 1
            private = r.engine.slots["hook"].consumer.ctx.state_dir
            assert private.is_dir()
        assert not private.exists()  # the plugin's temporary directory is removed on close
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]


async def test_none_state_dir_when_embedding(tmp_path, recorder_cls):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.conf").write_text("a")
    cfg = dataclasses.replace(parse_config({"reloadd": {"quiet": "100ms"}}), state_dir=None)
    rec = recorder_cls([root])
    async with Reloader(cfg, consumers=[rec]) as r:
        await r.wait_idle(10)
        (root / "a.conf").write_text("b")
        await rec.wait_path(root / "a.conf", 2)
        await r.wait_idle(10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]
