"""reloadd's own OCI image: built offline and reproducibly, imported by reloadd, and it runs.

``scripts/image/build_image.py`` (what ``make image`` runs) bootstraps Debian with mmdebstrap from the
machine's own sources and installs the project's wheels: no container registry anywhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from reloadd import Ack
from tests.containerd_images._helpers import Harness
from tests.infra import private_containerd

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
NAME = "localhost/reloadd:0.1.0"


def build(out: Path, work: Path) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/image/build_image.py"), str(out), "--work", str(work)],
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return hashlib.sha256(out.read_bytes()).hexdigest()


def unpack(archive: Path, into: Path) -> dict[str, object]:
    """The image's root file system (its one layer) under ``into``; returns its config."""
    with tarfile.open(archive) as outer:
        def blob(digest: str) -> bytes:
            f = outer.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
            assert f is not None
            return f.read()

        index = json.loads(blob_of(outer, "index.json"))
        (entry,) = index["manifests"]
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == NAME
        manifest = json.loads(blob(entry["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO(blob(layer["digest"])), mode="r:gz") as inner:
                inner.extractall(into, filter="fully_trusted")
    return config


def blob_of(tar: tarfile.TarFile, name: str) -> bytes:
    f = tar.extractfile(name)
    assert f is not None
    return f.read()


async def test_the_image_is_reproducible_imports_and_runs(tmp_path: Path) -> None:
    first = await asyncio.to_thread(build, tmp_path / "a.tar", tmp_path / "work-a")
    second = await asyncio.to_thread(build, tmp_path / "b.tar", tmp_path / "work-b")
    assert first == second, "two builds of the same inputs differ"

    rootfs = tmp_path / "rootfs"
    config = await asyncio.to_thread(unpack, tmp_path / "a.tar", rootfs)
    env = {e.split("=", 1)[0]: e.split("=", 1)[1] for e in config["config"]["Env"]}  # type: ignore[index]
    entry = config["config"]["Entrypoint"]  # type: ignore[index]
    for args, expected in ((["--version"], "reloadd 0.1.0"),
                           (["check", "--config", "/etc/reloadd/reloadd.toml"], "OK (2 consumer(s))"),  # node agent
                           (["check", "--config", "/etc/reloadd/applier.toml"], "OK (1 consumer(s))")):
        proc = await asyncio.to_thread(subprocess.run, ["/usr/sbin/chroot", str(rootfs), *entry, *args],
                                       env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and expected in proc.stdout + proc.stderr, (args, proc.stdout, proc.stderr)

    async with private_containerd(tmp_path) as ctd:
        images = tmp_path / "images"
        images.mkdir()
        os.link(tmp_path / "a.tar", images / "reloadd.tar")
        (tmp_path / "state").mkdir()
        h = Harness(ctd, images, tmp_path / "state", {})
        try:
            res = await h.handle(images / "reloadd.tar")
            assert isinstance(res[images / "reloadd.tar"], Ack), res
            img = await h.consumer.client.get_image(NAME)
            assert img is not None and img.labels.get("io.cri-containerd.pinned") == "pinned"
        finally:
            await h.consumer.close()
