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
    roots = [REPO / "src" / "reloadd", *(REPO / "plugins").glob("*/src")]
    sizes = {f.relative_to(REPO).as_posix(): len(f.read_text().splitlines())
             for root in roots for f in root.rglob("*.py") if "_proto" not in f.parts}
    n, where = lines[2].split()  # the longest module, listed first
    assert sizes[where] == int(n) == max(sizes.values())
    assert len([ln for ln in lines if ln.startswith("  ") and ln.strip()[0].isdigit()]) == 6
    assert "_proto" not in out  # generated code is left out
