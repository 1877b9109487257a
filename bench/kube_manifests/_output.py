"""The output tail every kube-manifests benchmark shares: the result as JSON on stdout, ``--json``, ``--md``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["emit"]


def emit(result: dict[str, Any], json_path: Path | None, md_path: Path | None,
         markdown: Callable[[dict[str, Any]], str]) -> None:
    """Print ``result`` as JSON; also write it to ``json_path`` and its ``markdown`` section to ``md_path``."""
    text = json.dumps(result, indent=2)
    print(text)
    if json_path:
        json_path.write_text(text + "\n")
    if md_path:
        md_path.write_text(markdown(result))
