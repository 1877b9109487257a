"""Tarball imports against a real containerd, compared with ``ctr images import --all-platforms``."""

from __future__ import annotations

import asyncio
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from reloadd_containerd_images import _ingest
from reloadd_containerd_images._content import write_blob as real_write_blob
from reloadd_containerd_images._ingest import SMALL

from reloadd import Ack
from tests.containerd_images._helpers import Harness, dump, sync_gc
from tests.infra import (
    Containerd,
    ImageSpec,
    compress,
    deterministic_tar,
    write_docker_archive,
    write_oci_archive,
)
from tests.waiting import until

pytestmark = pytest.mark.timeout(120)

MULTI = ("linux/amd64", "linux/arm64", "linux/arm/v7")


def _make(kind: str, path: Path) -> list[str]:
    """Write an archive of ``kind``; return the image names in it."""
    if kind == "oci":
        write_oci_archive(
            path,
            [
                ImageSpec("docker.io/library/hello:v1", seed="h", layers=3),
                ImageSpec("example.com/team/app:2.0", seed="a", extra_tags=("example.com/team/app:latest",)),
            ],
        )
        return ["docker.io/library/hello:v1", "example.com/team/app:2.0", "example.com/team/app:latest"]
    if kind == "docker":
        write_docker_archive(
            path,
            [
                ImageSpec("docker.io/library/dock:v1", seed="d", layer_compression="none"),
                ImageSpec("registry.local:5000/x/y:v2", seed="e", layer_compression="gzip"),
            ],
        )
        return ["docker.io/library/dock:v1", "registry.local:5000/x/y:v2"]
    if kind == "multi":
        write_oci_archive(path, [ImageSpec("example.com/multi:v1", platforms=MULTI, seed="m")])
        return ["example.com/multi:v1"]
    if kind == "zstd-layers":
        write_oci_archive(path, [ImageSpec("example.com/zl:v1", seed="z", layer_compression="zstd")])
        return ["example.com/zl:v1"]
    raise AssertionError(kind)


UNPACK_LABELS = ("containerd.io/uncompressed", "containerd.io/gc.ref.snapshot.overlayfs")


def _assert_host_platform_unpack_of(got: dict[str, Any], want: dict[str, Any]) -> None:
    """``got`` is ``want`` with only the host platform unpacked.

    containerd 2.x's ``ctr images import --all-platforms`` unpacks every platform of an index;
    reloadd unpacks the node's own only (what kubelet runs; docs/containerd-versions.md). So:
    the same blobs, each with a subset of ctr's labels, the missing ones being unpack labels,
    and a subset of ctr's snapshots.
    """
    assert [c[:2] for c in got["content"]] == [c[:2] for c in want["content"]]
    for (digest, _, ours), (_, _, theirs) in zip(got["content"], want["content"], strict=True):
        assert set(ours) <= set(theirs), digest
        assert {k for k, _ in set(theirs) - set(ours)} <= set(UNPACK_LABELS), digest
    assert set(got["snapshots"]) < set(want["snapshots"])


async def _compare_with_ctr(ctd: Containerd, h: Harness, ours: Path, plain: Path, names: list[str]) -> None:
    res = await h.handle(ours)
    assert isinstance(res[ours], Ack), res
    await ctd.ctr("images", "import", "--all-platforms", str(plain), namespace="ctr")
    await sync_gc(ctd.address)
    got, want = await dump(ctd.address, "ours"), await dump(ctd.address, "ctr")
    assert sorted(n for n, *_ in got["images"]) == sorted(names)
    assert got["images"] == want["images"]
    if ctd.release.name == "2.x" and ours.name.startswith("multi"):
        _assert_host_platform_unpack_of(got, want)
        assert len(got["snapshots"]) * len(MULTI) == len(want["snapshots"])
    else:
        assert got["content"] == want["content"]
        assert got["snapshots"] == want["snapshots"]
    assert len(got["snapshots"]) > 0
    for n in names:
        assert got["labels"][n]["io.cri-containerd.pinned"] == "pinned"
        assert got["labels"][n]["reloadd.io/source"] == str(ours)


@pytest.mark.parametrize("kind", ["oci", "docker", "multi", "zstd-layers"])
async def test_import_equals_ctr(kind: str, ctd: Containerd, harness: Callable[..., Harness]) -> None:
    h = harness(namespace="ours")
    path = h.root / f"{kind}.tar"
    names = _make(kind, path)
    await _compare_with_ctr(ctd, h, path, path, names)


@pytest.mark.parametrize("suffix", ["tar.gz", "tgz", "tar.zst", "TZST", "tar.bz2", "tbz", "tar.lz4"])
@pytest.mark.parametrize("kind", ["oci", "docker"])
async def test_compressed_equals_ctr_of_plain(
    suffix: str, kind: str, ctd: Containerd, harness: Callable[..., Harness], tmp_path: Path
) -> None:
    h = harness(namespace="ours")
    plain = tmp_path / f"{kind}.tar"
    names = _make(kind, plain)
    codec = {
        "tar.gz": "gz",
        "tgz": "gz",
        "tar.zst": "zst",
        "TZST": "zst",
        "tar.bz2": "bz2",
        "tbz": "bz2",
        "tar.lz4": "lz4",
    }[suffix]
    packed = compress(plain, codec, dest=h.root / f"{kind}.{suffix}")
    await _compare_with_ctr(ctd, h, packed, plain, names)


async def test_cri_sees_imported_images(ctd: Containerd, harness: Callable[..., Harness]) -> None:
    h = harness()
    path = h.root / "multi.tar"
    built = write_oci_archive(path, [ImageSpec("example.com/multi:v1", platforms=MULTI, seed="c")])
    res = await h.handle(path)
    assert isinstance(res[path], Ack)
    amd64 = next(p for p in built[0].platforms if p.platform == "linux/amd64")
    st = await ctd.cri_image_status("example.com/multi:v1")
    assert st is not None
    assert st.id == amd64.config.digest
    assert "example.com/multi:v1" in st.repo_tags
    listed = {i.id for i in await ctd.cri_list_images()}
    assert amd64.config.digest in listed
    ls = await ctd.ctr("images", "ls", "-q")
    assert f"example.com/multi@{built[0].target.digest}" in ls.split()
    assert amd64.config.digest in ls.split()
    snaps = await ctd.ctr("snapshots", "ls")
    assert amd64.chain_ids[-1] in snaps


async def test_missing_platform_content_is_skipped(ctd: Containerd, harness: Callable[..., Harness]) -> None:
    h = harness()
    path = h.root / "partial.tar"
    built = write_oci_archive(
        path,
        [ImageSpec("example.com/partial:v1", platforms=MULTI, seed="p")],
        missing_platforms=["linux/arm64", "linux/arm/v7"],
    )
    res = await h.handle(path)
    assert isinstance(res[path], Ack), res
    img = await h.consumer.client.get_image("example.com/partial:v1")
    assert img is not None and img.target.digest == built[0].target.digest
    index_labels = await h.consumer.client.content_info(built[0].target.digest)
    assert index_labels is not None
    amd64 = built[0].platforms[0]
    assert set(index_labels.values()) == {amd64.manifest.digest}
    assert await ctd.cri_image_status("example.com/partial:v1") is not None


async def test_platforms_option_limits_content(ctd: Containerd, harness: Callable[..., Harness]) -> None:
    h = harness(platforms=["linux/arm64"], unpack=False)
    path = h.root / "multi.tar"
    built = write_oci_archive(path, [ImageSpec("example.com/multi:v1", platforms=MULTI, seed="q")])
    res = await h.handle(path)
    assert isinstance(res[path], Ack)
    labels = await h.consumer.client.content_info(built[0].target.digest)
    arm64 = next(p for p in built[0].platforms if p.platform == "linux/arm64")
    assert labels is not None and set(labels.values()) == {arm64.manifest.digest}
    assert (await ctd.ctr("snapshots", "ls")).strip().count("\n") == 0  # header only: unpack off


async def test_reimport_sends_nothing(ctd: Containerd, harness: Callable[..., Harness]) -> None:
    h = harness()
    path = h.root / "hello.tar"
    write_oci_archive(path, [ImageSpec("docker.io/library/hello:v1", seed="r", layer_size=1 << 21)])
    await h.handle(path)
    sent = h.consumer.stats["bytes_sent"]
    assert sent > 2 << 20
    shutil.copy(path, h.root / "copy.tar")
    res = await h.handle(h.root / "copy.tar")
    assert isinstance(res[h.root / "copy.tar"], Ack)
    assert h.consumer.stats["bytes_sent"] == sent


def _small_members_first(src: Path, dest: Path) -> None:
    """Rewrite an archive with its small members (index, manifest, config) before the layers."""
    with tarfile.open(src) as tf:
        entries = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]  # type: ignore[union-attr]
    dest.write_bytes(deterministic_tar(sorted(entries, key=lambda e: len(e[1]) > SMALL)))


async def test_small_blobs_are_written_beside_the_layers(
    ctd: Containerd, harness: Callable[..., Harness], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small blob's write (round trips and containerd's fsyncs) does not hold back the streaming of the layers
    after it; and a config still being written when its layers are unpacked gets its snapshot label all the same."""
    h = harness(namespace="ours")
    plain = tmp_path / "plain.tar"
    built = write_oci_archive(plain, [ImageSpec("example.com/beside:v1", seed="b", layers=2, layer_size=3 << 20)])
    path = h.root / "beside.tar"
    _small_members_first(plain, path)
    image = built[0].platforms[0]
    config, layers, top = image.config.digest, len(image.layers), image.chain_ids[-1]
    streaming, layers_in = asyncio.Event(), asyncio.Event()
    big_done = 0

    async def write_blob(client: Any, ref: str, total: int, expected: str, *a: Any, **k: Any) -> Any:
        nonlocal big_done
        if total > SMALL:
            streaming.set()
            res = await real_write_blob(client, ref, total, expected, *a, **k)
            big_done += 1
            if big_done == layers:
                layers_in.set()
            return res
        # Written inline (before the layers after it were read), this would wait for ever.
        await asyncio.wait_for(streaming.wait(), 10)
        if expected == config:  # held until the early unpack has made the whole chain, and then some
            await asyncio.wait_for(layers_in.wait(), 30)
            await until(lambda: client.snapshot_exists("overlayfs", top), what="the chain unpacked", every=0.02)
            await asyncio.sleep(0.5)  # the unpack labels the config next: not before the config is in
        return await real_write_blob(client, ref, total, expected, *a, **k)

    monkeypatch.setattr(_ingest, "write_blob", write_blob)
    res = await h.handle(path)
    assert isinstance(res[path], Ack), res
    await ctd.ctr("images", "import", "--all-platforms", str(plain), namespace="ctr")
    await sync_gc(ctd.address)
    got, want = await dump(ctd.address, "ours"), await dump(ctd.address, "ctr")
    assert got["images"] == want["images"]
    assert got["content"] == want["content"]  # the config's gc.ref.snapshot label included
    assert got["snapshots"] == want["snapshots"] and len(got["snapshots"]) == layers
