"""The size report ``make check`` prints (#63): it lists the longest modules and functions and never fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]


def test_the_size_report_lists_the_longest_and_exits_zero() -> None:
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "size_report.py"), "--top", "3"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    lines = out.splitlines()
    assert lines[0].startswith("size report (reports, never fails):")
    assert "src/reloadd/_pipeline/_engine.py" in out  # the longest core module today
    assert len([ln for ln in lines if ln.startswith("  ") and ln.strip()[0].isdigit()]) == 6
    assert "_proto" not in out  # generated code is left out
