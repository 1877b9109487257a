"""The exec consumer: batch JSON on stdin, non-zero exit retried."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest
from reloadd_exec import create

import reloadd
from reloadd import Ack, Batch, Change, ChangeKind, ConfigError, ConsumerContext, Fingerprint, Reason, Retry

pytestmark = pytest.mark.timeout(30)


def ctx(tmp_path: Path, **options) -> ConsumerContext:
    return ConsumerContext(name="hook", paths=(tmp_path,), options=options, state_dir=tmp_path)


async def test_batch_json_on_stdin(tmp_path):
    out = tmp_path / "seen.json"
    consumer = create(ctx(tmp_path, command=[sys.executable, "-c",
                                             f"import sys; open({str(out)!r}, 'w').write(sys.stdin.read())"]))
    batch = Batch("hook", Reason.INOTIFY, (
        Change(tmp_path / "a", ChangeKind.MODIFIED, Fingerprint(1, 12, 34, 56)),
        Change(tmp_path / "b", ChangeKind.DELETED, None),
    ))
    results = await consumer.handle(batch)
    assert results == {tmp_path / "a": Ack(), tmp_path / "b": Ack()}
    assert json.loads(out.read_text()) == {
        "consumer": "hook",
        "reason": "inotify",
        "changes": [
            {"path": str(tmp_path / "a"), "kind": "modified", "size": 12, "mtime_ns": 34},
            {"path": str(tmp_path / "b"), "kind": "deleted", "size": None, "mtime_ns": None},
        ],
    }


async def test_failure_and_timeout_are_retried(tmp_path):
    batch = Batch("hook", Reason.RESCAN, (Change(tmp_path / "a", ChangeKind.ADDED, Fingerprint(1, 1, 1, 1)),))
    failing = create(ctx(tmp_path, command=["sh", "-c", "echo nope; exit 3"]))
    (result,) = (await failing.handle(batch)).values()
    assert isinstance(result, Retry) and result.error == "sh exited with 3: nope"
    slow = create(ctx(tmp_path, command=["sleep", "10"], timeout="200ms"))
    (result,) = (await slow.handle(batch)).values()
    assert isinstance(result, Retry) and "timed out after 0.2s" in result.error
    missing = create(ctx(tmp_path, command=["/nonexistent/hook"]))
    (result,) = (await missing.handle(batch)).values()
    assert isinstance(result, Retry) and "cannot run /nonexistent/hook" in result.error


def test_options_validated(tmp_path):
    with pytest.raises(ConfigError, match="unknown key"):
        create(ctx(tmp_path, command=["true"], shell=True))
    with pytest.raises(ConfigError, match="'timeout'"):
        create(ctx(tmp_path, command=["true"], timeout="forever"))


async def test_runs_for_one_path_never_overlap_and_the_last_sees_the_final_content(tmp_path):
    """exec stays ordered per path: a change made while the command runs is handed over after it ends."""
    watched = tmp_path / "watched"
    watched.mkdir()
    log = tmp_path / "runs.log"
    script = (
        "import json, sys, time\n"
        f"log = open({str(log)!r}, 'a', buffering=1)\n"
        "paths = [c['path'] for c in json.load(sys.stdin)['changes']]\n"
        "content = open(paths[0]).read() if paths else ''\n"
        "log.write(f'start {time.monotonic()} {content}\\n')\n"
        "time.sleep(0.4)\n"
        "log.write(f'end {time.monotonic()}\\n')\n"
    )
    cfg = reloadd.parse_config({
        "reloadd": {"state_dir": str(tmp_path / "state"), "quiet": "50ms"},
        "consumer": [{"name": "hook", "plugin": "exec", "paths": [str(watched)],
                      "options": {"command": [sys.executable, "-c", script]}}],
    })
    target = watched / "a.conf"
    async with reloadd.Reloader(cfg) as r:
        await r.wait_idle(10)
        target.write_text("v1")
        deadline = time.monotonic() + 10
        while not (log.exists() and "start" in log.read_text()):
            assert time.monotonic() < deadline, "the command never ran"
            await asyncio.sleep(0.02)
        for v in ("v2", "v3"):  # while the first run is still going
            target.write_text(v)
            await asyncio.sleep(0.1)
        await r.wait_idle(15)
    lines = [line.split() for line in log.read_text().splitlines()]
    kinds = [line[0] for line in lines]
    assert kinds == ["start", "end"] * (len(kinds) // 2) and len(kinds) >= 4, lines
    times = [float(line[1]) for line in lines]
    assert times == sorted(times), "two runs for the same path overlapped"
    assert lines[-2][2] == "v3", f"the last run did not see the final content: {lines}"
