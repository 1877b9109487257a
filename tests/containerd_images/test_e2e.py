"""End to end through the engine: a folder watched by ``Reloader`` with this plugin configured."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from reloadd_containerd_images import ContainerdImagesConsumer

import reloadd
from tests.infra import Containerd, ImageSpec, write_docker_archive, write_oci_archive

pytestmark = pytest.mark.timeout(120)

PIN = "io.cri-containerd.pinned"


def _config(tmp_path: Path, ctd: Containerd) -> reloadd.Config:
    toml = tmp_path / "reloadd.toml"
    toml.write_text(f"""
[reloadd]
state_dir = "{tmp_path / "state"}"
quiet = "100ms"

[[consumer]]
name = "images"
plugin = "containerd-images"
paths = ["{tmp_path / "images"}"]
[consumer.options]
address = "{ctd.address}"
concurrency = 2
""")
    return reloadd.load_config(toml)


def _consumer(r: reloadd.Reloader) -> ContainerdImagesConsumer:
    c = r.engine.slots["images"].consumer
    assert isinstance(c, ContainerdImagesConsumer)
    return c


async def test_folder_to_containerd_and_restart(ctd: Containerd, tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    cfg = _config(tmp_path, ctd)
    write_oci_archive(images / "at-start.tar", [ImageSpec("example.com/start:v1", seed="st")])
    async with reloadd.Reloader(cfg) as r:
        await r.wait_idle(60)
        assert await ctd.cri_image_status("example.com/start:v1") is not None
        # Dropped in while running: written under a temporary name, then renamed in.
        tmp = tmp_path / "incoming.tmp"
        write_docker_archive(tmp, [ImageSpec("docker.io/library/live:v2", seed="live")])
        os.rename(tmp, images / "live.tar")
        for _ in range(200):
            if await ctd.cri_image_status("docker.io/library/live:v2") is not None:
                break
            await asyncio.sleep(0.05)
        await r.wait_idle(60)
        img = await _consumer(r).client.get_image("docker.io/library/live:v2")
        assert img is not None and img.labels[PIN] == "pinned"
        assert img.labels["reloadd.io/source"] == str(images / "live.tar")

    # Restart with unchanged files: nothing is imported again.
    async with reloadd.Reloader(cfg) as r:
        await r.wait_idle(60)
        c = _consumer(r)
        await asyncio.wait_for(c.verified.wait(), 30)
        await r.wait_idle(60)
        assert c.stats["files_imported"] == 0
        assert c.stats["bytes_sent"] == 0
        # Deleting the file unpins its image (default on_delete = unpin).
        (images / "live.tar").unlink()
        for _ in range(400):
            img = await c.client.get_image("docker.io/library/live:v2")
            if img is not None and PIN not in img.labels:
                break
            await asyncio.sleep(0.05)
        await r.wait_idle(60)
        img = await c.client.get_image("docker.io/library/live:v2")
        assert img is not None and PIN not in img.labels
        start = await c.client.get_image("example.com/start:v1")
        assert start is not None and start.labels[PIN] == "pinned"
