"""Property: after any interleaving of writes, renames and deletes, what was delivered matches the disk."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reloadd import ChangeKind, Fingerprint, Reloader, parse_config

from ..conftest import Recorder

NAMES = ["a.conf", "b.conf", "c.conf", "sub/d.conf"]

op = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(NAMES), st.binary(min_size=0, max_size=64)),
    st.tuples(st.just("rename"), st.sampled_from(NAMES), st.sampled_from(NAMES)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES), st.just(b"")),
    st.tuples(st.just("pause"), st.sampled_from([0.0, 0.02, 0.15]), st.just(b"")),
)


def apply(root: Path, step: tuple) -> None:
    kind, a, b = step
    if kind == "write":
        p = root / a
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b)
    elif kind == "rename":
        src, dst = root / a, root / b
        if src.exists() and src != dst:
            dst.parent.mkdir(exist_ok=True)
            os.replace(src, dst)
    elif kind == "delete":
        (root / a).unlink(missing_ok=True)


async def scenario(base: Path, ops: list[tuple]) -> None:
    root = base / "root"
    root.mkdir()
    rec = Recorder([root])
    cfg = parse_config({"reloadd": {"state_dir": str(base / "state"), "quiet": "50ms", "max_delay": "1s"}})
    async with Reloader(cfg, consumers=[rec]) as r:
        await r.wait_idle(10)
        for step in ops:
            if step[0] == "pause":
                await asyncio.sleep(step[1])
            else:
                apply(root, step)
        sentinel = base / "root" / "zz-sentinel"
        sentinel.write_text("end")
        await rec.wait_path(sentinel, timeout=20)
        await r.wait_idle(20)
        # Prune safety: when every file of the root went at once, their removal is held (and listed), not run.
        held = {h["path"] for h in r.engine.slots["rec"].queue.status()["prune_held"]}
    on_disk = {p for p in root.rglob("*") if p.is_file() and p != sentinel}
    last = {}
    for c in rec.changes:
        last[c.path] = c
    for p in on_disk:
        assert p in last, f"{p} exists but was never delivered"
        assert last[p].kind is not ChangeKind.DELETED
        if last[p].fingerprint != Fingerprint.from_stat(os.stat(p)):
            # only times moved since (same bytes rewritten): the content must be what was delivered
            assert last[p].digest == hashlib.sha256(p.read_bytes()).hexdigest(), p
    for p, c in last.items():
        if p not in on_disk and p != sentinel:
            assert c.kind is ChangeKind.DELETED or str(p) in held, (
                f"{p} is gone but its last change was {c.kind} and its removal is not held")
    assert held <= {str(p) for p in last if p not in on_disk}, "a removal is held for a file still there"


@pytest.mark.timeout(600)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=25))
def test_delivered_state_matches_disk(ops):
    base = Path(tempfile.mkdtemp(prefix="reloadd-prop-"))
    try:
        asyncio.run(scenario(base, ops))
    finally:
        shutil.rmtree(base, ignore_errors=True)
