"""``after`` (one consumer's batches wait for another's work) and ``group`` (paths that go together)."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from reloadd import ConfigError, Reloader, Retry, parse_config
from reloadd._ops._terminal import format_status
from reloadd._pipeline import _settle

from ..conftest import config_for

pytestmark = pytest.mark.timeout(60)


def _conf(*tables: dict) -> dict:
    return {"reloadd": {"state_dir": ""}, "consumer": list(tables)}


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ([{"name": "a", "plugin": "exec", "after": ["nope"]}], "'after' names unknown consumer 'nope'"),
        ([{"name": "a", "plugin": "exec", "after": ["a"]}], "consumer 'a' lists itself in 'after'"),
        (
            [
                {"name": "a", "plugin": "exec", "after": ["c"]},
                {"name": "b", "plugin": "exec", "after": ["a"]},
                {"name": "c", "plugin": "exec", "after": ["b"]},
            ],
            "'after' forms a cycle: a -> c -> b -> a",
        ),
        ([{"name": "a", "plugin": "exec", "group": [[]]}], "key 'group'[0] must be a glob or a non-empty list"),
        ([{"name": "a", "plugin": "exec", "group": [3]}], "key 'group'[0] must be a glob"),
    ],
)
def test_bad_after_and_group_are_config_errors(tables, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_config(_conf(*tables))


def test_valid_after_chain_parses():
    cfg = parse_config(_conf(
        {"name": "mirrors", "plugin": "registry-mirrors"},
        {"name": "images", "plugin": "containerd-images", "after": ["mirrors"]},
        {"name": "manifests", "plugin": "kube-manifests", "after": ["images", "mirrors"],
         "group": [["tls.crt", "tls.key"], "conf.d/*.conf"]},
    ))
    assert cfg.consumers[1].after == ("mirrors",)
    assert cfg.consumers[2].group == (("tls.crt", "tls.key"), ("conf.d/*.conf",))


async def test_embedded_cycle_is_refused(tmp_path, recorder_cls):
    a = recorder_cls([tmp_path], name="a", after=("b",))
    b = recorder_cls([tmp_path], name="b", after=("a",))
    with pytest.raises(ConfigError, match="cycle"):
        async with Reloader(config_for(tmp_path), consumers=[a, b]):
            pass


async def test_batches_wait_while_the_named_consumer_works(tmp_path, recorder_cls, start_reloader):
    ra, rb = tmp_path / "a", tmp_path / "b"
    ra.mkdir()
    rb.mkdir()
    a = recorder_cls([ra], name="a")
    b = recorder_cls([rb], name="b", after=("a",))
    r = await start_reloader(a, b)
    a.gate = asyncio.Event()
    (ra / "x.conf").write_text("x")
    await asyncio.wait_for(a.entered.wait(), 10)
    (rb / "y.conf").write_text("y")
    deadline = time.monotonic() + 10
    while r.status()["consumers"]["b"]["waiting_for"] != ["a"]:
        assert time.monotonic() < deadline, r.status()["consumers"]["b"]
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # well past b's quiet period: only the order holds it
    assert b.batches == []
    assert "after:     waits for a to finish its work" in format_status(r.status())
    released = time.monotonic()
    a.gate.set()
    await b.wait_path(rb / "y.conf")
    assert time.monotonic() >= released
    await r.wait_idle(10)
    assert r.status()["consumers"]["b"]["waiting_for"] == []


async def test_a_failing_path_upstream_does_not_hold_others_back(tmp_path, recorder_cls, start_reloader):
    ra, rb = tmp_path / "a", tmp_path / "b"
    ra.mkdir()
    rb.mkdir()
    a = recorder_cls([ra], name="a", results=lambda change: Retry("down"))
    b = recorder_cls([rb], name="b", after=("a",))
    await start_reloader(a, b)
    (ra / "x.conf").write_text("x")
    await a.wait_path(ra / "x.conf")
    (rb / "y.conf").write_text("y")
    await b.wait_path(rb / "y.conf", timeout=5)


async def test_startup_pass_keeps_the_order(tmp_path, recorder_cls):
    ra, rb = tmp_path / "a", tmp_path / "b"
    ra.mkdir()
    rb.mkdir()
    for i in range(5):
        (ra / f"{i}.img").write_text(str(i))
        (rb / f"{i}.yaml").write_text(str(i))
    a = recorder_cls([ra], name="a", gate=asyncio.Event())
    b = recorder_cls([rb], name="b", after=("a",))
    async with Reloader(config_for(tmp_path), consumers=[a, b]) as r:
        await asyncio.wait_for(a.entered.wait(), 10)
        await asyncio.sleep(0.5)
        assert b.batches == []
        a.gate.set()
        await r.wait_idle(10)
        assert len(b.changes) == 5 and len(a.changes) == 5


@pytest.mark.parametrize("first", ["tls.crt", "tls.key"])
async def test_group_members_settling_together_arrive_in_one_batch(tmp_path, recorder_cls, start_reloader, first):
    root = tmp_path / "tls"
    root.mkdir()
    rec = recorder_cls([root], name="tls", group=(("tls.crt", "tls.key"),))
    r = await start_reloader(rec)
    second = "tls.key" if first == "tls.crt" else "tls.crt"
    rng = random.Random(7)
    for n in range(5):
        rec.batches.clear()
        (root / first).write_text(f"{first} {n}")
        await asyncio.sleep(rng.uniform(0.02, 0.08))  # inside the 100 ms quiet of the first
        (root / second).write_text(f"{second} {n}")
        await rec.wait_path(root / second)
        await r.wait_idle(10)
        assert [sorted(c.path.name for c in b.changes) for b in rec.batches] == [["tls.crt", "tls.key"]]


async def test_group_mates_found_at_start_up_arrive_in_one_batch_though_taken_in_one_at_a_time(
        tmp_path, recorder_cls, monkeypatch):
    """A walk's findings go into the aggregator a step at a time (one here): the group's mates still go together."""
    root = tmp_path / "tls"
    root.mkdir()
    for name in ("a.conf", "tls.crt", "b.conf", "tls.key", "c.conf", "d.conf"):
        (root / name).write_text(name)
    monkeypatch.setattr(_settle, "_STEP", 1)
    monkeypatch.setattr(_settle, "_FEED_MAX", 1)  # one finding taken in, and one path settled, per turn
    rec = recorder_cls([root], name="tls", group=(("tls.crt", "tls.key"),))
    async with Reloader(config_for(tmp_path, state_dir=""), consumers=[rec]) as r:
        await r.wait_idle(10)
    batches = [sorted(c.path.name for c in b.changes) for b in rec.batches]
    assert sorted(n for b in batches for n in b) == ["a.conf", "b.conf", "c.conf", "d.conf", "tls.crt", "tls.key"]
    tls = [b for b in batches if "tls.crt" in b or "tls.key" in b]
    assert len(tls) == 1 and {"tls.crt", "tls.key"} <= set(tls[0]), batches


async def test_embedded_consumer_gets_records_and_its_own_trigger(tmp_path, recorder_cls, start_reloader):
    ra, rb = tmp_path / "a", tmp_path / "b"
    ra.mkdir()
    rb.mkdir()
    (ra / "x.conf").write_text("x")
    (rb / "y.conf").write_text("y")
    a = recorder_cls([ra], name="a")
    b = recorder_cls([rb], name="b")
    r = await start_reloader(a, b)
    assert set(a.ctx.records) == {ra / "x.conf"}
    assert a.log.name == "reloadd.consumer.a"
    a.batches.clear()
    b.batches.clear()
    a.ctx.trigger(None)
    await a.wait_path(ra / "x.conf")
    await r.wait_idle(10)
    assert [c.forced for c in a.changes] == [True]
    assert b.batches == []
