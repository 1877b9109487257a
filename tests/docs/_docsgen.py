"""Import the reference generator (scripts/docs/docsgen), which is a tool, not a package of the project."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def docsgen(module: str = "") -> ModuleType:
    """``docsgen`` or one of its modules (``docsgen("render")``)."""
    where = str(REPO / "scripts" / "docs")
    if where not in sys.path:
        sys.path.insert(0, where)
    return importlib.import_module("docsgen" + (f".{module}" if module else ""))
