"""One ``make demo`` shared by the README's first result and the guides' demo snippets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ._docsgen import REPO


@dataclass(frozen=True)
class Demo:
    """A running demo: ``cwd`` holds ``examples/demo`` (its folders); ``env`` is its demo.env."""

    cwd: Path
    env: Path
    log: Path

    def run(self, script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``script`` with bash (errexit, pipefail) in ``cwd`` after sourcing demo.env."""
        return subprocess.run(["bash", "-c", f"set -euo pipefail\n. {self.env}\n{script}"], cwd=self.cwd,
                              capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """``python -m examples.demo.run_demo`` (what ``make demo`` runs), interactive, until the session ends."""
    work = tmp_path_factory.mktemp("demo")
    folders = work / "examples" / "demo"
    log = work / "demo.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "examples.demo.run_demo", "--folders", str(folders)],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    env = folders / "demo.env"
    try:
        deadline = time.monotonic() + 180
        # demo.env appears once reloadd runs; kube_get once the kube-apiserver is up (`make kube` built it)
        while not (env.exists() and "kube_get" in env.read_text()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the demo did not come up:\n{log.read_text(errors='replace')}")
            time.sleep(0.2)  # polling a file another process writes; there is no event to wait on
        yield Demo(work, env, log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the demo stops all it started
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert not env.exists(), "the demo leaves no demo.env behind"
