"""What differs between containerd 1.6, 1.7 and 2.x, checked on each (the ``ctd`` fixture is the matrix).

containerd 2.1.9 panics (nil target in ``imageFromProto``) on an ``Images.Update`` whose image has
no target, which a labels-only update used to send; 1.6 accepted it. Every image write must carry a
whole image, and no daemon may panic through the suite (the fixture reads its log at teardown).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from reloadd import Ack, ChangeKind
from tests.containerd_images._helpers import Harness
from tests.infra import Containerd, ImageSpec, write_oci_archive

pytestmark = pytest.mark.timeout(120)


class _RecordingImages:
    """Wraps an ``ImagesStub``: every Update/Create request is kept before it is sent."""

    def __init__(self, stub: Any, sent: list[tuple[str, Any]]) -> None:
        self._stub = stub
        self._sent = sent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)

    async def Update(self, req: Any, **kw: Any) -> Any:
        self._sent.append(("Update", req.image))
        return await self._stub.Update(req, **kw)

    async def Create(self, req: Any, **kw: Any) -> Any:
        self._sent.append(("Create", req.image))
        return await self._stub.Create(req, **kw)


def _record(h: Harness) -> list[tuple[str, Any]]:
    sent: list[tuple[str, Any]] = []
    client = h.consumer.client
    client.images = _RecordingImages(client.images, sent)  # type: ignore[assignment]
    return sent


async def test_every_image_write_is_a_whole_image(ctd: Containerd, harness: Callable[..., Harness]) -> None:
    """Import, unpin on delete, adopt on re-add, restore a removed pin: no request lacks a target."""
    h = harness()
    sent = _record(h)
    path = h.root / "app.tar"
    built = write_oci_archive(
        path, [ImageSpec("example.com/app:v1", seed="w"), ImageSpec("example.com/other:v2", seed="x")]
    )
    assert isinstance((await h.handle(path))[path], Ack)
    path.rename(h.root / "gone.tar.bak")
    assert isinstance((await h.handle(path, kind=ChangeKind.DELETED))[path], Ack)  # unpin: labels only
    (h.root / "gone.tar.bak").rename(path)
    assert isinstance((await h.handle(path))[path], Ack)  # adopt: re-label, re-pin
    # A pin removed behind our back is put back by the start-up check (a labels-only update).
    await h.consumer.client.set_image_labels("example.com/app:v1", {"io.cri-containerd.pinned": None})
    h2 = harness()
    h2.records.update(h.records)
    sent2 = _record(h2)
    await h2.consumer.start()
    await asyncio.wait_for(h2.consumer.verified.wait(), 30)
    assert h2.consumer.stats["pins_restored"] >= 1

    writes = sent + sent2
    labels_only = [img for op, img in writes if op == "Update" and "pinned" not in img.labels]
    assert labels_only, "the unpin path sent no update: the test no longer covers it"
    targets = {b.target.digest for b in built}
    for op, img in writes:
        assert img.name, (op, img)
        assert img.HasField("target"), f"{op} of {img.name} carries no target"
        assert img.target.digest.startswith("sha256:") and img.target.size > 0 and img.target.media_type
        if not img.name.startswith("sha256:") and "@" not in img.name:
            assert img.target.digest in targets
    assert ctd.running, f"containerd {ctd.release.name} died:\n{ctd.log_tail()}"


async def test_pin_is_what_kubelet_sees(ctd: Containerd, harness: Callable[..., Harness]) -> None:
    """CRI reports the image pinned (kubelet's GC keeps it) on 1.7+; unpinned once its file goes."""
    h = harness()
    path = h.root / "pin.tar"
    write_oci_archive(path, [ImageSpec("example.com/pin:v1", seed="p")])
    assert isinstance((await h.handle(path))[path], Ack)
    honours_pin = ctd.release.name != "1.6"  # CRI reads io.cri-containerd.pinned from 1.7.3 on
    st = await ctd.cri_image_status("example.com/pin:v1")
    assert st is not None and st.pinned is honours_pin
    path.unlink()
    assert isinstance((await h.handle(path, kind=ChangeKind.DELETED))[path], Ack)
    for _ in range(100):  # CRI updates its cache from the image event, asynchronously
        st = await ctd.cri_image_status("example.com/pin:v1")
        if st is not None and not st.pinned:
            break
        await asyncio.sleep(0.05)
    assert st is not None and st.pinned is False  # unpinned, still present (on_delete = unpin)
    img = await h.consumer.client.get_image("example.com/pin:v1")
    assert img is not None and "io.cri-containerd.pinned" not in img.labels


async def test_server_version_is_the_release_under_test(ctd: Containerd, harness: Callable[..., Harness]) -> None:
    """The matrix really runs three different daemons (a mis-set PATH would test 1.6 three times)."""
    h = harness()
    version = await h.consumer.client.version()
    want = {"1.6": "1.6.", "1.7": "1.7.", "2.x": "2."}[ctd.release.name]
    assert version.lstrip("v").startswith(want), version

