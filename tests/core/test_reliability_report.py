"""The reliability report (`make faults`) is rewritten only by a session that passed with nothing skipped.

Each case runs a small pytest session in a subprocess with the ``tests.reliability`` plugin and a
report that already exists, and checks whether that file was replaced.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
OLD = "# Reliability\n\nthe previous report\n"


def session(tmp_path: Path, *, fail: bool = False, skip: bool = False) -> tuple[str, str]:
    """Run a two-test session that records a row; return (the report afterwards, pytest's output)."""
    (tmp_path / "test_rows.py").write_text(textwrap.dedent(f"""
        import pytest

        def test_records(reliability):
            reliability.record("a measured row", trials=1, expected=3, delivered=len("abc"))

        def test_other():
            if {skip!r}:
                pytest.skip("not on this machine")
            assert not {fail!r}
    """))
    report = tmp_path / "reliability.md"
    report.write_text(OLD)
    env = {**os.environ, "RELOADD_RELIABILITY_REPORT": str(report), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.reliability",
         "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_rows.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )
    return report.read_text(), proc.stdout + proc.stderr


def test_a_passing_session_writes_the_measured_rows(tmp_path: Path) -> None:
    text, out = session(tmp_path)
    assert "| a measured row | 1 | 3 | 3 | 0 | 0 |  |" in text, out
    assert "the previous report" not in text


@pytest.mark.parametrize(("kind", "why"), [("fail", "the session did not pass (exit status 1)"),
                                           ("skip", "1 test(s) skipped")])
def test_a_failed_or_partial_session_leaves_the_report_untouched(tmp_path: Path, kind: str, why: str) -> None:
    text, out = session(tmp_path, fail=kind == "fail", skip=kind == "skip")
    assert text == OLD, out
    assert f"reliability: {tmp_path / 'reliability.md'} left untouched: {why}" in out
