"""Every marked snippet of README.md and docs/ runs as written (the convention is in ``_snippets``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ._docsgen import DOCS, REPO
from ._snippets import Snippet, all_snippets, snippets
from .conftest import Demo

BIN = Path(sys.executable).parent


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}


def _ids(items: list[Snippet]) -> list[str]:
    return [s.id for s in items]


CONFIGS = all_snippets("config")
SHELL = all_snippets("sh")
PYTHON = all_snippets("python")
DEMO = [s for s in all_snippets("demo") if s.page != REPO / "README.md"]  # test_readme runs the README's


def test_every_guide_has_a_snippet_a_test_runs() -> None:
    for page in sorted((DOCS / "guides").glob("*.md")):
        assert snippets(page), f"{page.relative_to(REPO)} has no <!-- run: ... --> or <!-- check: ... --> block"


@pytest.mark.parametrize("snippet", CONFIGS, ids=_ids(CONFIGS))
def test_config_snippet_passes_reloadd_check(snippet: Snippet, tmp_path: Path) -> None:
    """A whole reloadd.toml of the docs is accepted by `reloadd check` (its state_dir moved to a temp dir)."""
    text = re.sub(r'(?m)^state_dir = ".*"$', f'state_dir = "{tmp_path / "state"}"', snippet.text)
    cfg = tmp_path / "reloadd.toml"
    cfg.write_text(text)
    done = subprocess.run([BIN / "reloadd", "check", "--config", str(cfg)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, f"{snippet.id}: {done.stdout}{done.stderr}"


@pytest.mark.parametrize("snippet", SHELL, ids=_ids(SHELL))
def test_shell_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    """Run from the repository root, as the page says; scratch files go to $TMPDIR."""
    done = subprocess.run(["bash", "-c", "set -euo pipefail\n" + snippet.text], cwd=REPO, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{snippet.id}: {done.stdout}{done.stderr}"


@pytest.mark.parametrize("snippet", PYTHON, ids=_ids(PYTHON))
def test_python_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-W", "error", "-c", snippet.text], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{snippet.id}: {done.stdout}{done.stderr}"


@pytest.mark.parametrize("snippet", DEMO, ids=_ids(DEMO))
def test_demo_snippet_runs(snippet: Snippet, demo: Demo) -> None:
    """Against the running `make demo`, in page order; each block cleans up what it dropped."""
    done = demo.run(snippet.text)
    assert done.returncode == 0, f"{snippet.id}:\n{done.stdout}\n{done.stderr}\n{demo.log.read_text()[-3000:]}"
