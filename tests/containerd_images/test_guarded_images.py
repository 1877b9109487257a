"""Guarded images (#23): an image removed or unpinned behind reloadd's back comes back, through containerd's events.

Real containerd (1.6, 1.7, 2.x), real ``ctr`` as an operator runs it, and a real restart of containerd; no SIGHUP,
no periodic rescan (a removed image changes no file, so only the event stream can tell).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from reloadd_containerd_images import ContainerdImagesConsumer
from reloadd_containerd_images._events import drifted, owners_of

import reloadd
from reloadd import Fingerprint, PathRecord
from tests.infra import Containerd, ImageSpec, write_oci_archive

pytestmark = pytest.mark.timeout(180)

PIN = "io.cri-containerd.pinned"
SOURCE = "reloadd.io/source"
REF = "example.com/guarded/app:v1"


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 30.0) -> None:
    """Poll containerd (another process: no event of ours to await) until ``check`` holds."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _config(tmp_path: Path, ctd: Containerd) -> reloadd.Config:
    toml = tmp_path / "reloadd.toml"
    toml.write_text(f"""
[reloadd]
state_dir = "{tmp_path / "state"}"
quiet = "100ms"
rescan_interval = "0s"

[[consumer]]
name = "images"
plugin = "containerd-images"
paths = ["{tmp_path / "images"}"]
[consumer.options]
address = "{ctd.address}"
on_delete = "remove"
""")
    return reloadd.load_config(toml)


async def test_an_image_removed_unpinned_or_missed_during_a_restart_comes_back(ctd: Containerd, tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    app = images / "app.tar"
    write_oci_archive(app, [ImageSpec(REF, seed="guarded")])
    async with reloadd.Reloader(_config(tmp_path, ctd)) as r:
        await r.wait_idle(60)
        c = r.engine.slots["images"].consumer
        assert isinstance(c, ContainerdImagesConsumer)
        await asyncio.wait_for(c.verified.wait(), 30)

        async def restored() -> bool:
            img = await c.client.get_image(REF)
            return img is not None and img.labels.get(PIN) == "pinned" and img.labels.get(SOURCE) == str(app)

        assert await restored()
        drifts = ("containerd-events", "drifted")

        await ctd.ctr("images", "rm", REF)  # an operator's clean-up, or a script
        await eventually(restored, "the removed image imported again")
        assert r.engine.stats.events[drifts] >= 1

        await ctd.ctr("images", "label", REF, f"{PIN}=")  # the pin stripped (an empty value removes a label)
        await eventually(restored, "the pin put back")

        await ctd.restart()  # the stream ends; the supervisor opens it again and checks every recorded image
        await ctd.ctr("images", "rm", REF)  # seen as an event, or by that check if it came before the reconnect
        await eventually(restored, "a removal around a containerd restart noticed too")
        await r.wait_idle(60)
        assert not r.status()["consumers"]["images"]["failing"]

        imported = c.stats["files_imported"]
        seen = r.engine.stats.events[drifts]
        app.unlink()  # the file goes: its image is meant to go (on_delete = remove), and stays gone
        await eventually(lambda: _absent(c), "the image removed with its file")
        await r.wait_idle(60)
        await asyncio.sleep(1.0)  # what is asserted is that nothing more happens
        assert await c.client.get_image(REF) is None
        assert r.engine.stats.events[drifts] == seen and c.stats["files_imported"] == imported


async def _absent(c: ContainerdImagesConsumer) -> bool:
    return await c.client.get_image(REF) is None


def test_drift_rules() -> None:
    app, other = Path("/img/app.tar"), Path("/img/other.tar")
    data = {"kind": "tar", "images": [{"name": REF, "digest": "sha256:1", "refs": [REF]}]}
    owners = owners_of([(app, PathRecord(Fingerprint(1, 1, 1, 1), None, data)),
                        (other, PathRecord(Fingerprint(2, 1, 1, 1), None, data))])
    assert owners == {REF: [app, other]}
    exists = {app, other}.__contains__
    ours = {PIN: "pinned", SOURCE: str(other)}
    assert drifted("/images/delete", REF, {}, owners, pin=True, exists=exists) == app
    assert drifted("/images/update", REF, ours, owners, pin=True, exists=exists) is None  # our own write
    assert drifted("/images/update", REF, {SOURCE: str(other)}, owners, pin=True, exists=exists) == other
    assert drifted("/images/update", REF, {SOURCE: str(other)}, owners, pin=False, exists=exists) is None
    assert drifted("/images/update", REF, {PIN: "pinned", SOURCE: "/elsewhere"}, owners, pin=True,
                   exists=exists) == app
    assert drifted("/images/delete", "example.com/not/ours:v1", {}, owners, pin=True, exists=exists) is None
    assert drifted("/images/delete", REF, {}, owners, pin=True, exists=lambda p: False) is None  # file gone
