"""Hostile input corpus for containerd-images, driven through the real engine against a private containerd.

One folder per case under ``hostile/`` (see its README): ``generate.txt`` says
how to make the input at run time, ``expected.txt`` the text its recorded error must contain.
Each case: a good tarball is imported; the hostile file is dropped in; its record carries the
error; containerd got no image from it; the good image keeps its pin; a good tarball dropped
afterwards is imported.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import logging
import os
import random
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from reloadd_containerd_images._client import ContainerdClient

from reloadd import Reloader, parse_config
from tests.infra import ImageSpec, private_containerd, write_oci_archive
from tests.reliability import Reliability
from tests.waiting import until

pytestmark = pytest.mark.timeout(120)

CORPUS = Path(__file__).parent / "hostile"
CASES = sorted(p.name for p in CORPUS.iterdir() if p.is_dir())
PIN = "io.cri-containerd.pinned"


class _Zeros(io.RawIOBase):
    """``n`` zero bytes, read in chunks (a member far larger than memory needs)."""

    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        k = min(len(b), self.left)
        b[:k] = bytes(k)
        self.left -= k
        return k


def _archive(path: Path, name: str) -> None:
    write_oci_archive(path, [ImageSpec(name, seed=name, layers=1, layer_size=512)])


def generate(case: Path, root: Path, outside: Path) -> Path:
    """Make the case's input in ``root`` (through a temporary name, so it arrives whole)."""
    kind, name, *rest = (case / "generate.txt").read_text().split()
    n = int(rest[0]) if rest else 0
    target = root / name
    tmp = outside / f"{name}.part"
    if kind == "empty":
        tmp.write_bytes(b"")
    elif kind == "random":
        tmp.write_bytes(random.Random(name).randbytes(n))
    elif kind == "truncated":
        whole = outside / "whole.tar"
        write_oci_archive(whole, [ImageSpec("example.com/hostile/cut:v1", seed="cut", layers=1, layer_size=65536,
                                            layer_compression="none")])
        data = gzip.compress(whole.read_bytes())
        tmp.write_bytes(data[: len(data) // 2])
    elif kind == "bomb":
        with gzip.open(tmp, "wb", compresslevel=9) as gz, tarfile.open(fileobj=gz, mode="w|") as tar:
            layout = b'{"imageLayoutVersion": "1.0.0"}'
            li = tarfile.TarInfo("oci-layout")
            li.size = len(layout)
            tar.addfile(li, io.BytesIO(layout))
            info = tarfile.TarInfo("index.json")
            info.size = n
            tar.addfile(info, io.BufferedReader(_Zeros(n), 1 << 20))
    elif kind == "hugejson":
        with tarfile.open(tmp, "w") as tar:
            body = b"[" + b" " * (n - 2) + b"]"
            info = tarfile.TarInfo("manifest.json")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    elif kind == "symlink":
        _archive(outside / "elsewhere.tar", "example.com/hostile/outside:v1")
        os.symlink(outside / "elsewhere.tar", target)
        return target
    else:
        raise AssertionError(f"{case}: unknown kind {kind!r}")
    os.replace(tmp, target)
    return target


@pytest.mark.parametrize("name", CASES)
async def test_hostile_image(tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture,
                             reliability: Reliability) -> None:
    case = CORPUS / name
    expected = (case / "expected.txt").read_text().strip()
    images, outside = tmp_path / "images", tmp_path / "outside"
    images.mkdir()
    outside.mkdir()
    caplog.set_level(logging.WARNING)
    t0 = time.monotonic()
    async with private_containerd(tmp_path) as ctd:
        _archive(outside / "good.tar", "example.com/hostile/good:v1")
        os.replace(outside / "good.tar", images / "good.tar")
        cfg = parse_config({
            "reloadd": {"state_dir": str(tmp_path / "state"), "quiet": "100ms"},
            "consumer": [{"name": "images", "plugin": "containerd-images", "paths": [str(images)],
                          "options": {"address": ctd.address}}],
        })
        probe = ContainerdClient(ctd.address, "k8s.io")
        try:
            async with Reloader(cfg) as r:
                await r.wait_idle(60)
                before = {i.name for i in await probe.list_images()}
                assert "example.com/hostile/good:v1" in before
                records: Any = r.engine.slots["images"].records
                target = generate(case, images, outside)

                def errors() -> list[str]:
                    """The file's recorded error, or warnings naming it (the engine refuses some paths itself)."""
                    rec = records.get(target)
                    found = [rec.error] if rec is not None and rec.error else []
                    return found + [m.getMessage() for m in caplog.records
                                    if m.levelno >= logging.WARNING and str(target) in m.getMessage()]

                await until(lambda: any(expected in e for e in errors()),
                            timeout=60, what=f"an error for {target.name}")
                await r.wait_idle(60)
                assert {i.name for i in await probe.list_images()} == before  # nothing imported from it
                good = await probe.get_image("example.com/hostile/good:v1")
                assert good is not None and good.labels.get(PIN) == "pinned"
                doc = r.status()["consumers"]["images"]
                assert not doc["failing"], doc  # rejected for good, not retried in a loop
                _archive(outside / "after.tar", "example.com/hostile/after:v1")
                os.replace(outside / "after.tar", images / "after.tar")

                async def imported() -> bool:
                    img = await probe.get_image("example.com/hostile/after:v1")
                    return img is not None and img.labels.get(PIN) == "pinned"

                deadline = time.monotonic() + 60
                while not await imported():  # containerd publishes no event we could await here
                    assert time.monotonic() < deadline, "a good tarball dropped afterwards was not imported"
                    await asyncio.sleep(0.05)
                after = int(await imported())
        finally:
            probe.close()
    reliability.record(f"containerd-images hostile input: {name}", trials=1, expected=1, delivered=after,
                       notes=f"`{expected}`; the good file dropped afterwards imported; "
                             f"nothing imported from it; pins kept; {time.monotonic() - t0:.1f}s")
