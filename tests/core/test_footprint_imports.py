"""An embedded Reloader loads only what its configuration uses: no entry-point lookup (``importlib.metadata`` and
the email, zipfile and csv packages under it: 2.7 MiB), no TOML parser, no spelling suggestions, while the core's
sources stay the ones ``pyproject.toml`` registers."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import EntryPoint, entry_points

import pytest

from reloadd import PluginError
from reloadd._pipeline import _plugins
from reloadd._sources.inotify import InotifySource
from reloadd._sources.rescan import RescanSource
from reloadd._sources.signals import SignalSource

_EMBEDDED = r"""
import asyncio, json, sys
from pathlib import Path
from reloadd import BaseConsumer, ConsumerContext, Reloader, parse_config

root, state = Path(sys.argv[1]), Path(sys.argv[2])
got = []

class Count(BaseConsumer):
    async def handle(self, batch):
        got.extend(c.path.name for c in batch.changes)
        return {}

async def main():
    ctx = ConsumerContext(name="c", paths=(root,), options={}, state_dir=state / "c")
    async with Reloader(parse_config({"reloadd": {"state_dir": str(state), "quiet": "20ms"}}),
                        consumers=[Count(ctx)]) as r:
        await r.wait_idle(30)
        (root / "a.txt").write_text("a")
        for _ in range(500):
            if got:
                break
            await asyncio.sleep(0.02)
        await r.wait_idle(30)
        print(json.dumps({"got": got, "sources": sorted(r.source_names), "modules": sorted(sys.modules)}))

asyncio.run(main())
"""


def test_an_embedded_reloader_watches_without_the_plugin_lookup_or_the_config_parser(tmp_path) -> None:
    root = tmp_path / "watched"
    root.mkdir()
    out = subprocess.run([sys.executable, "-c", _EMBEDDED, str(root), str(tmp_path / "state")],
                         check=True, capture_output=True, text=True, timeout=120)
    seen = json.loads(out.stdout)
    assert seen["got"] == ["a.txt"]  # inotify and the rescanner run: the file is delivered
    assert seen["sources"] == ["inotify", "rescan"]
    loaded = set(seen["modules"])
    assert not loaded & {"importlib.metadata", "email", "zipfile", "csv", "tomllib", "difflib"}


def test_the_core_sources_are_the_registered_ones() -> None:
    registered = {ep.name: ep.value for ep in entry_points(group=_plugins.SOURCE_GROUP)}
    assert {n: registered.get(n) for n in _plugins.CORE_SOURCES} == _plugins.CORE_SOURCES
    assert _plugins.load(_plugins.SOURCE_GROUP, "inotify") is InotifySource
    assert _plugins.load(_plugins.SOURCE_GROUP, "rescan") is RescanSource
    assert _plugins.load(_plugins.SOURCE_GROUP, "signal") is SignalSource


def test_another_source_is_still_looked_up_among_the_entry_points(monkeypatch) -> None:
    ep = EntryPoint(name="elsewhere", value="reloadd._sources.rescan:RescanSource", group=_plugins.SOURCE_GROUP)
    monkeypatch.setattr(_plugins, "_entry_points", lambda group: {"elsewhere": ep})
    assert _plugins.load(_plugins.SOURCE_GROUP, "elsewhere") is RescanSource
    with pytest.raises(PluginError, match=r"No plugin named 'elswhere' \(did you mean 'elsewhere'\?\)"):
        _plugins.load(_plugins.SOURCE_GROUP, "elswhere")
