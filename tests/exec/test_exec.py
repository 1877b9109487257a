"""The exec consumer: batch JSON on stdin, non-zero exit retried."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from reloadd_exec import create

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
