"""Every hold has a limit and a visible reason (#25): a file kept open, a group mate, a consumer waited for."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reloadd import parse_config
from reloadd._ops._terminal import format_status
from tests.waiting import until

pytestmark = pytest.mark.timeout(60)

MAX_DELAY = 1.0

# Appends a line every 0.2 s to a file it keeps open, like a log; prints its pid first.
APPENDER = """
import os, sys, time
fh = open(sys.argv[1], "a", buffering=1)
print(os.getpid(), flush=True)
while True:
    fh.write("line\\n")
    time.sleep(0.2)
"""


class Appender:
    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", APPENDER, str(path)], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.pid = int(self.proc.stdout.readline())

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def appenders():
    made: list[Appender] = []

    def make(path: Path) -> Appender:
        made.append(Appender(path))
        return made[-1]

    yield make
    for a in made:
        a.stop()


def held(r, name: str) -> list[dict]:
    return list(r.status()["consumers"][name]["held"])


async def test_a_log_kept_open_holds_no_consumer_after_it_longer_than_max_delay(
        tmp_path, recorder_cls, start_reloader, appenders, caplog):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    a = recorder_cls([a_dir], name="A")
    b = recorder_cls([b_dir], name="B", after=["A"])
    r = await start_reloader(a, b, max_delay=f"{MAX_DELAY}s", quiet="100ms")
    log = a_dir / "app.log"
    writer = appenders(log)
    await until(lambda: bool(held(r, "A")), what="the log held past max_delay")
    entry = held(r, "A")[0]
    assert entry["path"] == str(log) and entry["why"] == "open for writing"
    assert entry["writers"] == [writer.pid]
    text = format_status({"consumers": {"A": r.status()["consumers"]["A"]}})
    assert f"HELD:      {log}: open for writing by pid {writer.pid}" in text and "1 settling" in text

    changed = time.monotonic()
    (b_dir / "x.conf").write_text("x")
    await b.wait_path(b_dir / "x.conf")
    assert time.monotonic() - changed < MAX_DELAY + 1.0, "B waited for A's log"
    assert not a.changes_for(log), "the log is still held for A (max_hold is 60s)"
    assert any("goes ahead without consumer" in m and str(log) in m for m in caplog.messages)


async def test_a_group_mate_kept_open_holds_the_other_member_at_most_max_delay(
        tmp_path, recorder_cls, start_reloader, appenders):
    root = tmp_path / "tls"
    root.mkdir()
    c = recorder_cls([root], name="tls", group=[["tls.crt", "tls.key"]])
    r = await start_reloader(c, max_delay=f"{MAX_DELAY}s", quiet="100ms")
    appenders(root / "tls.key")
    await until(lambda: bool(held(r, "tls")), what="the key held past max_delay")
    changed = time.monotonic()
    (root / "tls.crt").write_text("cert")
    await c.wait_path(root / "tls.crt")
    assert time.monotonic() - changed < MAX_DELAY + 1.0, "the cert waited for its held mate"


async def test_a_file_held_open_past_max_hold_is_handed_over_with_a_warning_naming_the_writer(
        tmp_path, recorder_cls, start_reloader, appenders, caplog):
    root = tmp_path / "logs"
    root.mkdir()
    c = recorder_cls([root], name="logs")
    await start_reloader(c, max_delay="500ms", max_hold="2s", quiet="100ms")
    caplog.set_level(logging.WARNING, logger="reloadd")
    log = root / "app.log"
    writer = appenders(log)
    await c.wait_path(log, timeout=10)
    warned = [m for m in caplog.messages if str(log) in m and "still open for writing" in m]
    assert warned and f"pid {writer.pid}" in warned[0] and "max_hold" in warned[0]


async def test_the_status_names_a_waiting_group_by_its_members(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "tls"
    root.mkdir()
    c = recorder_cls([root], name="tls", group=[["tls.crt", "tls.key"]], concurrency=2)  # a slot free to wait
    c.gate = asyncio.Event()  # the first member's batch stays in flight: its mate waits for it
    r = await start_reloader(c)
    (root / "tls.crt").write_text("cert")
    await asyncio.wait_for(c.entered.wait(), 10)
    (root / "tls.key").write_text("key")
    await until(lambda: bool(r.status()["consumers"]["tls"]["held_groups"]), what="the group held")
    assert r.status()["consumers"]["tls"]["held_groups"] == ["tls.crt + tls.key"]
    c.gate.set()
    await c.wait_path(root / "tls.key")


def test_absolute_group_globs_are_made_relative_or_refused(tmp_path):
    root = tmp_path / "tls"
    cfg = parse_config({"reloadd": {"state_dir": ""}, "consumer": [{
        "name": "tls", "plugin": "exec", "paths": [str(root)], "options": {"command": ["true"]},
        "group": [[str(root / "tls.crt"), str(root / "tls.key")]]}]})
    assert cfg.consumers[0].group == (("tls.crt", "tls.key"),)
    with pytest.raises(Exception, match="under none of the consumer's paths"):
        parse_config({"reloadd": {"state_dir": ""}, "consumer": [{
            "name": "tls", "plugin": "exec", "paths": [str(root)], "options": {"command": ["true"]},
            "group": [["/elsewhere/tls.crt"]]}]})


async def test_absolute_group_globs_arrive_as_one_batch(tmp_path, recorder_cls, start_reloader):
    root = tmp_path / "tls"
    root.mkdir()
    c = recorder_cls([root], name="tls", group=[[str(root / "tls.crt"), str(root / "tls.key")]])
    await start_reloader(c, quiet="300ms")
    (root / "tls.crt").write_text("cert")
    await asyncio.sleep(0.15)  # the other half lands 150 ms later, inside the quiet period
    (root / "tls.key").write_text("key")
    await c.wait_path(root / "tls.key")
    batch = next(b for b in c.batches if root / "tls.key" in b.paths)
    assert set(batch.paths) == {root / "tls.crt", root / "tls.key"}
