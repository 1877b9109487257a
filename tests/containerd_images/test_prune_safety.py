"""Prune safety (#21) on a real containerd: a lost images folder removes and unpins nothing until confirmed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from reloadd_containerd_images import ContainerdImagesConsumer

import reloadd
from tests.infra import Containerd, ImageSpec, write_oci_archive
from tests.waiting import until

pytestmark = pytest.mark.timeout(180)

PIN = "io.cri-containerd.pinned"
REFS = ("example.com/held/a:v1", "example.com/held/b:v1")


def _config(tmp_path: Path, ctd: Containerd) -> reloadd.Config:
    toml = tmp_path / "reloadd.toml"
    toml.write_text(f"""
[reloadd]
state_dir = "{tmp_path / "state"}"
quiet = "100ms"
rescan_interval = "200ms"

[[consumer]]
name = "images"
plugin = "containerd-images"
paths = ["{tmp_path / "images"}"]
[consumer.options]
address = "{ctd.address}"
on_delete = "remove"
""")
    return reloadd.load_config(toml)


async def _records(c: ContainerdImagesConsumer) -> dict[str, tuple[str, dict[str, str]] | None]:
    out: dict[str, tuple[str, dict[str, str]] | None] = {}
    for ref in REFS:
        img = await c.client.get_image(ref)
        out[ref] = None if img is None else (img.target.digest, dict(img.labels))
    return out


async def test_a_lost_images_folder_keeps_every_image_until_confirmed(ctd: Containerd, tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    write_oci_archive(images / "a.tar", [ImageSpec(REFS[0], seed="held-a")])
    write_oci_archive(images / "b.tar", [ImageSpec(REFS[1], seed="held-b")])
    async with reloadd.Reloader(_config(tmp_path, ctd)) as r:
        await r.wait_idle(60)
        c = r.engine.slots["images"].consumer
        assert isinstance(c, ContainerdImagesConsumer)
        await asyncio.wait_for(c.verified.wait(), 30)
        before = await _records(c)
        assert all(v is not None and v[1][PIN] == "pinned" for v in before.values())
        imported = c.stats["files_imported"]

        images.rename(tmp_path / "away")  # an unmounted volume
        await until(lambda: len(r.status()["consumers"]["images"]["prune_held"]) == 2, what="held")
        start = r.engine.stats.rescans
        await until(lambda: r.engine.stats.rescans >= start + 5, what="5 rescans")
        assert await _records(c) == before, "an image was removed or unpinned while its folder was lost"
        status = r.status()["consumers"]["images"]
        assert sum(h["size"] for h in status["prune_held"]) == 2 and status["prune_held_unit"] == "images"

        (tmp_path / "away").rename(images)
        await until(lambda: not r.status()["consumers"]["images"]["prune_held"], what="released")
        await r.wait_idle(60)
        assert await _records(c) == before
        assert c.stats["files_imported"] == imported, "the folder came back unchanged: nothing imported again"

        for f in images.iterdir():
            f.unlink()  # rm -rf images/*
        await until(lambda: len(r.status()["consumers"]["images"]["prune_held"]) == 2, what="held again")
        assert await _records(c) == before
        assert await r.confirm_prune("images") == 2
        await r.wait_idle(60)
        assert await _records(c) == {ref: None for ref in REFS}, "confirmed: exactly the held removals ran"
