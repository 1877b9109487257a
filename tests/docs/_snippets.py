"""The runnable snippets of README.md and docs/: a marker comment right above a fenced block.

The convention (invisible on GitHub and on the site)::

    <!-- run: demo -->     ```sh   run with bash against a running `make demo` (examples/demo/demo.env)
    <!-- run: sh -->       ```sh   run with bash in an empty scratch folder, reloadd on PATH
    <!-- run: python -->   ```python  run with the project's Python in a scratch folder
    <!-- check: config --> ```toml a whole reloadd.toml: `reloadd check` must accept it

Blocks without a marker are shown, not run (a systemd unit, output, a fragment of a larger file).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ._docsgen import DOCS, REPO

_MARK = re.compile(r"^<!--\s*(run|check):\s*([\w-]+)\s*-->\s*$")
_FENCE = re.compile(r"^(```+|~~~+)\s*(\w*)")
KINDS = {("run", "demo"), ("run", "sh"), ("run", "python"), ("check", "config")}


@dataclass(frozen=True)
class Snippet:
    """One marked block."""

    page: Path
    line: int
    kind: str
    """``demo``, ``sh``, ``python`` or ``config``."""
    text: str

    @property
    def id(self) -> str:
        """``docs/guides/operating.md:42`` (a test id)."""
        return f"{self.page.relative_to(REPO)}:{self.line}"


def pages() -> list[Path]:
    """README.md and every hand-written page of docs/ (the reference is generated; benchmarks are output)."""
    return [REPO / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "reference" not in p.parts)]


def snippets(page: Path) -> list[Snippet]:
    """The marked blocks of one page, in order; a marker not followed by a fence is an error."""
    lines = page.read_text().splitlines()
    out = []
    i = 0
    while i < len(lines):
        m = _MARK.match(lines[i])
        if not m:
            i += 1
            continue
        if (m.group(1), m.group(2)) not in KINDS:
            raise ValueError(f"{page}:{i + 1}: unknown marker {lines[i]!r}")
        fence = _FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if fence is None:
            raise ValueError(f"{page}:{i + 1}: marker not followed by a fenced block")
        end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith(fence.group(1)))
        out.append(Snippet(page, i + 3, m.group(2), "\n".join(lines[i + 2:end]) + "\n"))
        i = end + 1
    return out


def all_snippets(kind: str) -> list[Snippet]:
    """Every marked block of ``kind`` across README.md and docs/."""
    return [s for p in pages() for s in snippets(p) if s.kind == kind]
