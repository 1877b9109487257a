"""State through Ack data: restarts, adoption, re-pinning, and delete semantics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from reloadd import Ack, ChangeKind
from tests.containerd_images._helpers import Harness
from tests.infra import Containerd, ImageSpec, write_docker_archive, write_oci_archive

pytestmark = pytest.mark.timeout(180)

PIN = "io.cri-containerd.pinned"


async def _restart(h: Harness, harness: Callable[..., Harness], **options: object) -> Harness:
    """A new consumer (a reloadd restart) that inherits the engine's records."""
    await h.consumer.close()
    h2 = harness(**options)
    h2.records.update(h.records)
    await h2.consumer.start()
    await asyncio.wait_for(h2.consumer.verified.wait(), 30)
    return h2


async def test_restart_with_20_unchanged_files_sends_nothing(ctd: Containerd, harness: Callable[..., Harness]) -> None:
    h = harness(concurrency=4)
    await h.consumer.start()
    paths = []
    for i in range(20):
        p = h.root / f"img{i:02}.tar"
        write_oci_archive(p, [ImageSpec(f"example.com/app{i}:v1", seed=f"s{i}", layers=1)])
        paths.append(p)
    res = await h.handle(*paths)
    assert all(isinstance(r, Ack) for r in res.values()), res
    assert h.consumer.stats["images_imported"] == 20

    h2 = await _restart(h, harness, concurrency=4)
    assert h2.triggered == []
    assert h2.consumer.stats["bytes_sent"] == 0
    assert h2.consumer.stats["bytes_imported"] == 0
    assert h2.consumer.stats["pins_restored"] == 0


async def test_restart_repins_and_reimports(ctd: Containerd, harness: Callable[..., Harness]) -> None:
    h = harness()
    await h.consumer.start()
    a, b, c = h.root / "a.tar", h.root / "b.tar", h.root / "c.tar"
    write_oci_archive(a, [ImageSpec("example.com/a:v1", seed="a")])
    write_oci_archive(b, [ImageSpec("example.com/b:v1", seed="b")])
    write_oci_archive(c, [ImageSpec("example.com/c:v1", seed="c")])
    res = await h.handle(a, b, c)
    assert all(isinstance(r, Ack) for r in res.values()), res
    # While reloadd is down: someone unpins a, deletes b, and retags c elsewhere.
    await ctd.ctr("images", "label", "example.com/a:v1", f"{PIN}=")
    await ctd.ctr("images", "rm", "example.com/b:v1")
    other = h.root.parent / "other.tar"
    write_oci_archive(other, [ImageSpec("example.com/c:v1", seed="other")])
    await ctd.ctr("images", "import", str(other))

    h2 = await _restart(h, harness)
    assert sorted(h2.triggered) == [b, c]
    img_a = await h2.consumer.client.get_image("example.com/a:v1")
    assert img_a is not None and img_a.labels[PIN] == "pinned"
    assert h2.consumer.stats["pins_restored"] >= 1
    res = await h2.handle(b, c)
    assert all(isinstance(r, Ack) for r in res.values())
    assert (await h2.consumer.client.get_image("example.com/b:v1")) is not None
    want_c = h.records[c].data["images"][0]["digest"]
    img_c = await h2.consumer.client.get_image("example.com/c:v1")
    assert img_c is not None and img_c.target.digest == want_c


@pytest.mark.parametrize("kind", ["oci", "docker"])
async def test_adopts_image_imported_by_hand(kind: str, ctd: Containerd, harness: Callable[..., Harness]) -> None:
    h = harness()
    p = h.root / "hand.tar"
    spec = ImageSpec("example.com/hand:v1", seed="hand", layer_size=1 << 20, layer_compression="none")
    (write_oci_archive if kind == "oci" else write_docker_archive)(p, [spec])
    await ctd.ctr("images", "import", str(p))
    before = await h.consumer.client.get_image("example.com/hand:v1")
    assert before is not None and PIN not in before.labels
    res = await h.handle(p)
    assert isinstance(res[p], Ack)
    after = await h.consumer.client.get_image("example.com/hand:v1")
    assert after is not None and after.labels[PIN] == "pinned"
    assert after.target == before.target
    assert h.consumer.stats["bytes_sent"] == 0


async def test_shared_image_stays_pinned_until_last_file_goes(ctd: Containerd, harness: Callable[..., Harness]) -> None:
    h = harness()
    spec = ImageSpec("example.com/shared:v1", seed="sh")
    one, two = h.root / "one.tar", h.root / "two.tar"
    write_oci_archive(one, [spec])
    write_oci_archive(two, [spec, ImageSpec("example.com/only-two:v1", seed="o2")])
    res = await h.handle(one, two)
    assert all(isinstance(r, Ack) for r in res.values()), res

    res = await h.handle(one, kind=ChangeKind.DELETED)
    assert isinstance(res[one], Ack)
    shared = await h.consumer.client.get_image("example.com/shared:v1")
    assert shared is not None and shared.labels.get(PIN) == "pinned"

    res = await h.handle(two, kind=ChangeKind.DELETED)
    assert isinstance(res[two], Ack)
    for name in ("example.com/shared:v1", "example.com/only-two:v1"):
        img = await h.consumer.client.get_image(name)
        assert img is not None and PIN not in img.labels  # default on_delete=unpin keeps the image
    assert h.records == {}


async def test_on_delete_remove_and_keep(ctd: Containerd, harness: Callable[..., Harness]) -> None:
    rm = harness(on_delete="remove")
    p = rm.root / "rm.tar"
    built = write_oci_archive(p, [ImageSpec("example.com/rm:v1", seed="rm")])
    await rm.handle(p)
    await rm.handle(p, kind=ChangeKind.DELETED)
    listed = await ctd.ctr("images", "ls", "-q")
    assert "example.com/rm:v1" not in listed
    assert built[0].platforms[0].config.digest not in listed  # the CRI alias went too
    assert await ctd.cri_image_status("example.com/rm:v1") is None

    keep = harness(on_delete="keep")
    q = keep.root / "keep.tar"
    write_oci_archive(q, [ImageSpec("example.com/keep:v1", seed="keep")])
    await keep.handle(q)
    await keep.handle(q, kind=ChangeKind.DELETED)
    img = await keep.consumer.client.get_image("example.com/keep:v1")
    assert img is not None and img.labels.get(PIN) == "pinned"


async def test_modified_file_releases_images_it_no_longer_has(ctd: Containerd, harness: Callable[..., Harness]) -> None:
    h = harness(on_delete="remove")
    p = h.root / "bundle.tar"
    write_oci_archive(p, [ImageSpec("example.com/x:v1", seed="x"), ImageSpec("example.com/y:v1", seed="y")])
    await h.handle(p)
    write_oci_archive(p, [ImageSpec("example.com/x:v1", seed="x2")])
    res = await h.handle(p)
    assert isinstance(res[p], Ack)
    assert await h.consumer.client.get_image("example.com/y:v1") is None
    x = await h.consumer.client.get_image("example.com/x:v1")
    assert x is not None and x.target.digest == res[p].data["images"][0]["digest"]


async def test_no_pin_option(ctd: Containerd, harness: Callable[..., Harness]) -> None:
    h = harness(pin=False, labels={"team": "infra"})
    p = h.root / "np.tar"
    write_oci_archive(p, [ImageSpec("example.com/np:v1", seed="np")])
    await h.handle(p)
    img = await h.consumer.client.get_image("example.com/np:v1")
    assert img is not None and PIN not in img.labels and img.labels["team"] == "infra"


async def test_start_check_waits_for_containerd(ctd: Containerd, harness: Callable[..., Harness]) -> None:
    h = harness()
    p = h.root / "later.tar"
    write_oci_archive(p, [ImageSpec("example.com/later:v1", seed="later")])
    await h.handle(p)
    await h.consumer.close()
    await ctd.ctr("images", "label", "example.com/later:v1", f"{PIN}=")
    await ctd.stop()

    h2 = harness()
    h2.records.update(h.records)
    await h2.consumer.start()  # containerd is down: the check keeps retrying in the background
    await ctd.start()
    await asyncio.wait_for(h2.consumer.verified.wait(), 60)
    img = await h2.consumer.client.get_image("example.com/later:v1")
    assert img is not None and img.labels[PIN] == "pinned"
    assert h2.triggered == []


async def test_corrupt_rewrite_keeps_old_images_until_delete(ctd: Containerd, harness: Callable[..., Harness]) -> None:
    h = harness()
    p = h.root / "app.tar"
    write_oci_archive(p, [ImageSpec("example.com/app:v1", seed="v1")])
    await h.handle(p)
    p.write_bytes(b"not a tarball any more")
    res = await h.handle(p)
    assert not isinstance(res[p], Ack) and "not a tar archive" in res[p].error
    img = await h.consumer.client.get_image("example.com/app:v1")
    assert img is not None and img.labels[PIN] == "pinned"  # nothing already imported is touched
    res = await h.handle(p, kind=ChangeKind.DELETED)
    assert isinstance(res[p], Ack)
    img = await h.consumer.client.get_image("example.com/app:v1")
    assert img is not None and PIN not in img.labels
