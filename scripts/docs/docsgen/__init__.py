"""Generate reloadd's reference pages from its code (``make reference``).

The configuration keys and plugin options are read from the ``Options`` calls that parse them
(:mod:`docsgen.options`), the metrics from the ``Family`` definitions the collector exports
(:mod:`docsgen.metrics`), the commands and flags from the argparse parser (:mod:`docsgen.cli`).
Meanings come from the docstrings next to them. Nothing is written by hand in ``docs/reference/``
but ``api.md``'s mkdocstrings directive, which is generated too, so one command rebuilds them all
and ``tests/docs/test_reference.py`` can tell when the code and the pages part ways.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
REFERENCE = REPO / "docs" / "reference"
REGENERATE = "make reference"
"""The command named in every drift message."""
