"""The README: short, two set-up commands, and a first result that works as written."""

from __future__ import annotations

import re

from ._docsgen import REPO
from ._snippets import snippets
from .conftest import Demo

README = REPO / "README.md"


def test_readme_is_a_short_first_screen() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 120
    setup = text.split("## Set up", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert setup == ["apt-get update && apt-get install -y make python3-venv && make demo", "make test"]


def test_readme_links_resolve() -> None:
    for target in re.findall(r"\]\(([^)#]+)", README.read_text()):
        if "://" not in target:
            assert (REPO / target).exists(), target


def test_readme_first_result_lands(demo: Demo) -> None:
    """The "First result" block, run as written against `make demo`: the image and the ConfigMap land."""
    [first] = [s for s in snippets(README) if s.kind == "demo"]
    assert len(first.text.splitlines()) <= 20
    done = demo.run(first.text)
    assert done.returncode == 0, f"{first.id}:\n{done.stdout}\n{done.stderr}\n{demo.log.read_text()[-3000:]}"
    assert "docker.io/demo/hello:v1" in done.stdout
    assert '"greeting": "hello"' in done.stdout
    assert "gone: kube_get configmaps/hello-from-reloadd" in done.stdout
