"""Bad inputs are rejected with a clear error; containerd outages are retried and leave nothing behind."""

from __future__ import annotations

import asyncio
import gc
import gzip
import json
import os
import random
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from reloadd_containerd_images import _ingest
from reloadd_containerd_images._content import write_blob as real_write_blob
from reloadd_containerd_images._errors import BadImageFile
from reloadd_containerd_images._ingest import SMALL

from reloadd import Ack, Reject, Retry
from tests.containerd_images._helpers import Harness
from tests.infra import Containerd, ImageSpec, build_image, compress, deterministic_tar, write_oci_archive

pytestmark = pytest.mark.timeout(180)


def _big_manifest_archive(path: Path) -> None:
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": "sha256:" + "0" * 64,
                "size": 2,
            },
            "layers": [],
            "annotations": {"pad": "x" * (50 << 20)},
        }
    ).encode()
    import hashlib

    d = hashlib.sha256(manifest).hexdigest()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": f"sha256:{d}",
                    "size": len(manifest),
                    "annotations": {"io.containerd.image.name": "example.com/huge:v1"},
                }
            ],
        }
    ).encode()
    path.write_bytes(
        deterministic_tar(
            [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index), (f"blobs/sha256/{d}", manifest)]
        )
    )


async def test_bad_inputs_are_rejected_clearly(
    ctd: Containerd, harness: Callable[..., Harness], tmp_path: Path
) -> None:
    h = harness()
    root = h.root
    good = root / "good.tar"
    write_oci_archive(good, [ImageSpec("example.com/good:v1", seed="good")])
    (root / "empty.tar").write_bytes(b"")
    (root / "random.tar").write_bytes(random.Random(1).randbytes(64 << 10))
    full = tmp_path / "full.tar"
    write_oci_archive(full, [ImageSpec("example.com/trunc:v1", seed="t", layer_size=256 << 10)])
    packed = gzip.compress(full.read_bytes(), mtime=0)
    (root / "truncated.tar.gz").write_bytes(packed[: len(packed) // 2])
    spec = build_image(ImageSpec("example.com/missing:v1", seed="m"))
    write_oci_archive(root / "missing-blob.tar", [spec], omit=[spec.platforms[0].layers[1].digest])
    _big_manifest_archive(root / "huge-manifest.tar")
    outside = tmp_path / "outside.tar"
    write_oci_archive(outside, [ImageSpec("example.com/outside:v1", seed="out")])
    os.symlink(outside, root / "link.tar")

    cases = {
        "empty.tar": "file is empty",
        "random.tar": "not a tar archive",
        "truncated.tar.gz": "truncated",
        "missing-blob.tar": f"blob {spec.platforms[0].layers[1].digest}",
        "huge-manifest.tar": "bytes allowed for JSON",
        "link.tar": "outside the watched folder",
    }
    res = await h.handle(good, *(root / n for n in cases))
    assert isinstance(res[good], Ack), res[good]
    for name, cause in cases.items():
        r = res[root / name]
        assert isinstance(r, Reject), (name, r)
        assert str(root / name) in r.error and cause in r.error, (name, r.error)
    listed = {i.name for i in await h.consumer.client.list_images()}
    assert "example.com/good:v1" in listed
    assert not any(
        n.startswith(("example.com/missing", "example.com/huge", "example.com/outside", "example.com/trunc"))
        for n in listed
    )
    assert await h.consumer.client.list_leases() == []


async def test_containerd_down_is_retried(ctd: Containerd, harness: Callable[..., Harness]) -> None:
    h = harness()
    p = h.root / "app.tar"
    write_oci_archive(p, [ImageSpec("example.com/app:v1", seed="down")])
    await ctd.stop()
    res = await h.handle(p)
    assert isinstance(res[p], Retry), res
    assert str(p) in res[p].error and "unavailable" in res[p].error
    await ctd.start()
    res = await h.handle(p)
    assert isinstance(res[p], Ack), res
    assert await ctd.cri_image_status("example.com/app:v1") is not None


async def test_containerd_killed_mid_import(
    ctd: Containerd, harness: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    h = harness()
    p = h.root / "big.tar"
    built = write_oci_archive(
        p, [ImageSpec("example.com/big:v1", seed="big", layers=4, layer_size=24 << 20, layer_compression="none")]
    )
    task = asyncio.create_task(h.handle(p))
    # Wait until containerd has an ingest of ours in progress, then crash it. containerd
    # publishes no event for that, so its ingest list is polled.
    probe = h.consumer.client
    for _ in range(4000):
        if task.done() or await probe.list_ingests():
            break
        await asyncio.sleep(0.005)
    assert not task.done()
    await ctd.kill()
    res = await task
    assert isinstance(res[p], Retry), res
    gc.collect()  # a task left with an unread error is reported when it is collected
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
    await ctd.start()
    assert await probe.get_image("example.com/big:v1") is None  # no half-made record

    res = await h.handle(p)
    assert isinstance(res[p], Ack), res
    img = await probe.get_image("example.com/big:v1")
    assert img is not None and img.target.digest == built[0].target.digest
    assert (await ctd.ctr("leases", "ls", "-q")).split() == []
    assert (await ctd.ctr("content", "active")).strip().splitlines()[1:] == []
    assert built[0].platforms[0].chain_ids[-1] in await ctd.ctr("snapshots", "ls")


@pytest.mark.parametrize("codec", ["", "gz", "zst", "bz2", "lz4"])
async def test_truncated_file_is_reported_as_truncated(
    codec: str, ctd: Containerd, harness: Callable[..., Harness], tmp_path: Path
) -> None:
    h = harness()
    full = tmp_path / "full.tar"
    write_oci_archive(full, [ImageSpec("example.com/cut:v1", seed="cut", layer_size=512 << 10)])
    src = compress(full, codec) if codec else full
    cut = h.root / f"cut.tar{'.' + codec if codec else ''}"
    data = src.read_bytes()
    cut.write_bytes(data[: int(len(data) * 0.6)])
    res = await h.handle(cut)
    r = res[cut]
    assert isinstance(r, Reject), r
    assert "truncated" in r.error and "imported again when it changes" in r.error, r.error
    assert await h.consumer.client.get_image("example.com/cut:v1") is None


async def test_leases_of_an_interrupted_run_are_deleted_at_start(
    ctd: Containerd, harness: Callable[..., Harness]
) -> None:
    from datetime import timedelta

    h = harness()
    c = h.consumer.client
    # What a reloadd killed mid-import leaves: its lease (labelled with our consumer name) and an
    # unrelated lease of someone else, which must survive.
    await c.create_lease(timedelta(hours=1), {"reloadd.io/consumer": "images", "reloadd.io/instance": "old"})
    other = await c.create_lease(timedelta(hours=1), {"owner": "someone-else"})
    await h.consumer.start()
    await asyncio.wait_for(h.consumer.verified.wait(), 30)
    assert [lease for lease, _ in await c.list_leases()] == [other]


async def test_archive_without_image_names_is_rejected(ctd: Containerd, harness: Callable[..., Harness]) -> None:
    h = harness()
    built = build_image(ImageSpec("example.com/unnamed:v1", seed="unnamed"))
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": built.target.media_type,
                    "digest": built.target.digest,
                    "size": built.target.size,
                    "annotations": {"org.opencontainers.image.ref.name": "v1"},
                }
            ],
        }
    ).encode()
    p = h.root / "bare-tag.tar"
    entries = [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index)]
    entries += [("blobs/sha256/" + d.split(":", 1)[1], b) for d, b in sorted(built.blobs.items())]
    p.write_bytes(deterministic_tar(entries))
    res = await h.handle(p)
    assert isinstance(res[p], Reject), res
    assert str(p) in res[p].error and "no image names" in res[p].error
    assert await h.consumer.client.list_images() == []


def _small_first(built_at: Path, dest: Path, keep: float = 1.0) -> None:
    """``built_at`` rewritten to ``dest`` with its small members before the layers (the first ``keep`` of it)."""
    with tarfile.open(built_at) as tf:
        entries = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]  # type: ignore[union-attr]
    data = deterministic_tar(sorted(entries, key=lambda e: len(e[1]) > SMALL))
    dest.write_bytes(data[: int(len(data) * keep)])


async def test_a_small_blob_refused_beside_the_layers_fails_the_import(
    ctd: Containerd, harness: Callable[..., Harness], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = harness()
    plain = tmp_path / "plain.tar"
    write_oci_archive(plain, [ImageSpec("example.com/refused:v1", seed="rf", layers=2, layer_size=3 << 20)])
    p = h.root / "refused.tar"
    _small_first(plain, p)
    streaming = asyncio.Event()
    writes: list[asyncio.Task[Any]] = []

    async def write_blob(client: Any, ref: str, total: int, *a: Any, **k: Any) -> Any:
        if total > SMALL:
            streaming.set()
            return await real_write_blob(client, ref, total, *a, **k)
        writes.append(asyncio.current_task())  # type: ignore[arg-type]
        await asyncio.wait_for(streaming.wait(), 10)
        raise BadImageFile("containerd refused blob (by the test)")

    monkeypatch.setattr(_ingest, "write_blob", write_blob)
    r = (await h.handle(p))[p]
    assert isinstance(r, Reject), r
    assert str(p) in r.error and "refused blob (by the test)" in r.error, r.error
    assert writes and all(t.done() for t in writes)
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
    assert await h.consumer.client.get_image("example.com/refused:v1") is None
    assert await h.consumer.client.list_leases() == []


async def test_a_truncated_file_stops_the_small_blob_writes_beside_it(
    ctd: Containerd, harness: Callable[..., Harness], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = harness()
    plain = tmp_path / "plain.tar"
    write_oci_archive(plain, [ImageSpec("example.com/cutside:v1", seed="cs", layers=2, layer_size=3 << 20)])
    p = h.root / "cut.tar"
    _small_first(plain, p, keep=0.6)
    writes: list[asyncio.Task[Any]] = []

    async def write_blob(client: Any, ref: str, total: int, *a: Any, **k: Any) -> Any:
        if total <= SMALL:  # still running when the file ends early
            writes.append(asyncio.current_task())  # type: ignore[arg-type]
            await asyncio.sleep(10)
        return await real_write_blob(client, ref, total, *a, **k)

    monkeypatch.setattr(_ingest, "write_blob", write_blob)
    r = (await h.handle(p))[p]
    assert isinstance(r, Reject), r
    assert "truncated" in r.error, r.error
    assert writes and all(t.cancelled() for t in writes)
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
    assert await h.consumer.client.list_leases() == []
