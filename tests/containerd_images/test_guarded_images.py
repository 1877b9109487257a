"""Guarded images (#23): an image removed or unpinned behind reloadd's back comes back, through containerd's events.

Real containerd (1.6, 1.7, 2.x), real ``ctr`` as an operator runs it, and a real restart of containerd; no SIGHUP,
no periodic rescan (a removed image changes no file, so only the event stream can tell).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from reloadd_containerd_images import ContainerdImagesConsumer
from reloadd_containerd_images._events import drifted, owners_of

import reloadd
from reloadd import Fingerprint, PathRecord
from reloadd._pipeline._plan import plan
from tests.infra import Containerd, ImageSpec, Registry, local_registry, push_image, write_oci_archive
from tests.waiting import until

pytestmark = pytest.mark.timeout(180)

PIN = "io.cri-containerd.pinned"
SOURCE = "reloadd.io/source"
REF = "example.com/guarded/app:v1"


def _config(tmp_path: Path, ctd: Containerd, drift: str = "correct") -> reloadd.Config:
    toml = tmp_path / "reloadd.toml"
    toml.write_text(f"""
[reloadd]
state_dir = "{tmp_path / "state"}"
quiet = "100ms"
rescan_interval = "0s"

[[consumer]]
name = "images"
plugin = "containerd-images"
drift = "{drift}"
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
    async with local_registry(tmp_path) as reg:
        await _test_restored(ctd, tmp_path, images, app, reg)


async def _test_restored(ctd: Containerd, tmp_path: Path, images: Path, app: Path, reg: Registry) -> None:
    src = tmp_path / "pulled.tar"
    write_oci_archive(src, [ImageSpec("example.com/guarded/pulled:v1", seed="pulled")])
    pulled = f"{reg.host}/guarded/pulled:v1"
    await push_image(src, pulled)
    (images / "prepull.txt").write_text(f"{pulled}\n")
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
        target = (await c.client.get_image(REF)).target.digest  # type: ignore[union-attr]
        pulled_target = (await c.client.get_image(pulled)).target.digest  # type: ignore[union-attr]

        await ctd.ctr("images", "label", REF, f"{PIN}=")  # the pin stripped (an empty value removes a label)
        took = await until(restored, what="the pin put back")
        assert took <= 2.0, f"pin put back after {took:.1f}s"

        async def pulled_back() -> bool:
            img = await c.client.get_image(pulled)
            return img is not None and img.labels.get(PIN) == "pinned" and img.target.digest == pulled_target

        await ctd.cri_remove(pulled)  # CRI RemoveImage: what kubelet's image GC and `crictl rmi` call
        took = await until(pulled_back, what="the removed list image pulled again")
        assert took <= 5.0, f"pulled again after {took:.1f}s"

        await ctd.ctr("images", "rm", REF)  # an operator's clean-up, or a script
        took = await until(restored, what="the removed image imported again")
        assert took <= 5.0, f"imported again after {took:.1f}s"
        assert r.engine.stats.events[drifts] >= 1
        assert (await c.client.get_image(REF)).target.digest == target  # type: ignore[union-attr]
        kinds = {(d["kind"], d["what"], d["why"]) for d in r.status()["consumers"]["images"]["drift"]}
        assert ("image", REF, "deleted") in kinds and ("image", pulled, "deleted") in kinds, kinds

        await ctd.restart()  # the stream ends; the supervisor opens it again and checks every recorded image
        await ctd.ctr("images", "rm", REF)  # seen as an event, or by that check if it came before the reconnect
        await until(restored, what="a removal around a containerd restart noticed too")
        await r.wait_idle(60)
        assert not r.status()["consumers"]["images"]["failing"]

        imported = c.stats["files_imported"]
        seen = r.engine.stats.events[drifts]
        os.unlink(app)  # the file goes: its image is meant to go (on_delete = remove), and stays gone
        await until(lambda: _absent(c), what="the image removed with its file")
        await r.wait_idle(60)
        await asyncio.sleep(1.0)  # what is asserted is that nothing more happens
        assert await c.client.get_image(REF) is None
        assert r.engine.stats.events[drifts] == seen and c.stats["files_imported"] == imported


async def _absent(c: ContainerdImagesConsumer) -> bool:
    return await c.client.get_image(REF) is None


async def test_detect_lists_a_removed_image_and_puts_nothing_back(ctd: Containerd, tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    write_oci_archive(images / "app.tar", [ImageSpec(REF, seed="guarded")])
    async with reloadd.Reloader(_config(tmp_path, ctd, drift="detect")) as r:
        await r.wait_idle(60)
        c = r.engine.slots["images"].consumer
        assert isinstance(c, ContainerdImagesConsumer)
        await asyncio.wait_for(c.verified.wait(), 30)
        imported = c.stats["files_imported"]
        await ctd.ctr("images", "rm", REF)

        async def listed() -> bool:
            return bool(r.status()["consumers"]["images"]["drift"])

        await until(listed, what="the removal listed as drift")
        await asyncio.sleep(2.0)  # what is asserted is that nothing is put back
        await r.wait_idle(30)
        assert await c.client.get_image(REF) is None and c.stats["files_imported"] == imported
        (entry,) = r.status()["consumers"]["images"]["drift"]
        assert (entry["kind"], entry["what"], entry["why"], entry["restored"]) == ("image", REF, "deleted", False)
        assert r.snapshot().consumers[0].drift_total == {"image": 1}
        report = await plan(_config(tmp_path, ctd, drift="detect"))
        planned = [(c.action, c.target, (c.detail or {}).get("why")) for cs in report.consumers[0].changes.values()
                   for c in cs]
        assert planned == [("drift", REF, "deleted")] and report.exit_code == 2, planned


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
