"""Hostile input corpus for registry-mirrors, driven through the real engine (real inotify).

One folder per case under ``hostile/`` (see its README): the input files,
``expected.txt`` (the error text), optionally ``generate.txt`` (FIFOs, symlinks, huge and
deeply nested files made at run time) and ``known_bug.txt`` (a strict xfail with the reason).

Each case: a good mirror is applied; the hostile input is dropped in; the error names the
file and contains the expected text; the last good hosts.toml stays; nothing changes anywhere
in the tmp tree outside the inputs and the state dir; removing the input lets a new good
change apply.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.faults._daemon import tree_snapshot
from tests.registry_mirrors.conftest import mirror_conf
from tests.registry_mirrors.harness import Running, running_reloader

pytestmark = pytest.mark.timeout(90)

CORPUS = Path(__file__).parent / "hostile"
CASES = sorted(p.name for p in CORPUS.iterdir() if p.is_dir())


def _param(name: str) -> object:
    bug = CORPUS / name / "known_bug.txt"
    if bug.exists():
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=bug.read_text().strip()))
    return name


def place(case: Path, conf_d: Path, yaml: Path) -> Path:
    """Drop the case's input into place; return the path the error must name."""
    target: Path | None = None
    for f in sorted(case.iterdir()):
        if f.name in ("expected.txt", "generate.txt", "known_bug.txt"):
            continue
        target = yaml if f.name == "registries.yaml" else conf_d / f.name
        shutil.copyfile(f, target)
    gen = case / "generate.txt"
    if gen.exists():
        kind, name, *args = gen.read_text().split()
        target = conf_d / name
        if kind == "fifo":
            os.mkfifo(target)
        elif kind == "symlink":
            os.symlink(args[0], target)
        elif kind == "fill":
            with open(target, "wb") as f:
                f.truncate(0)
                f.write(b"#" * int(args[0]))  # one long comment: valid TOML, only too big
        elif kind == "nested":
            depth = int(args[0])
            target.write_text("a = " + "[" * depth + "]" * depth + "\n")
        else:
            raise AssertionError(f"{gen}: unknown kind {kind!r}")
    assert target is not None, f"{case}: no input"
    return target


def release(path: Path) -> None:
    """Unblock anything stuck opening ``path`` if it is a FIFO, then remove it."""
    with contextlib.suppress(OSError):
        if path.is_fifo():
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # a reader blocked in open() returns
            os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def error_for(run: Running, target: Path, caplog: pytest.LogCaptureFixture) -> list[str]:
    """Every reported error naming ``target``: its record, and warnings/errors logged."""
    found = []
    record = run.reloader.engine.slots["mirrors"].records.get(target)
    if record is not None and record.error:
        found.append(record.error)
    found += [r.getMessage() for r in caplog.records
              if r.levelno >= logging.WARNING and str(target) in r.getMessage()]
    return found


@pytest.mark.parametrize("name", [_param(n) for n in CASES])
async def test_hostile_input(tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture, reliability) -> None:
    case = CORPUS / name
    expected = (case / "expected.txt").read_text().strip()
    (tmp_path / "outside.conf").write_text(mirror_conf("outside.example.com", "m.example.net"))
    yaml = tmp_path / "etc" / "registries.yaml"
    target: Path | None = None
    caplog.set_level(logging.WARNING)
    t0 = time.monotonic()
    try:
        async with running_reloader(tmp_path, registries_yaml=str(yaml)) as run:
            good = run.conf_d / "10-good.conf"
            good.write_text(mirror_conf("good.example.com", "mirror.example.net"))
            await run.wait_path(good)
            await run.reloader.wait_idle(15)
            assert run.mirrors("good.example.com") == ["http://mirror.example.net"]
            skip = (tmp_path / "state", tmp_path / "etc")
            before = tree_snapshot(tmp_path, skip=skip)

            target = place(case, run.conf_d, yaml)
            try:
                async with asyncio.timeout(8):
                    await run.settle()  # a reconcile has read every input, the hostile one included
                errors = error_for(run, target, caplog)
                assert any(expected in e and target.name in e for e in errors), (expected, errors)
                assert tree_snapshot(tmp_path, skip=skip) == before  # last good kept, nothing written anywhere
            finally:
                release(target)  # a reader stuck on a FIFO must not outlive the test
            after = run.conf_d / "20-after.conf"
            after.write_text(mirror_conf("after.example.com", "mirror.example.net"))
            await run.wait_path(after)
            await run.settle()
            assert run.mirrors("after.example.com") == ["http://mirror.example.net"]
            assert run.mirrors("good.example.com") == ["http://mirror.example.net"]
            after = int(run.mirrors("after.example.com") == ["http://mirror.example.net"])
    finally:
        if target is not None:
            release(target)
    reliability.record(f"registry-mirrors hostile input: {name}", trials=1, expected=1, delivered=after,
                       notes=f"`{expected}`; the drop-in added afterwards applied; "
                             f"last good kept, nothing written; {time.monotonic() - t0:.1f}s")
