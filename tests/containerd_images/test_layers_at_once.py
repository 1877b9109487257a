"""The layers of an uncompressed archive go into containerd at once, read by their offsets in the file."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from reloadd_containerd_images import _ingest
from reloadd_containerd_images._archive import ArchiveReader
from reloadd_containerd_images._content import write_blob as real_write_blob
from reloadd_containerd_images._ingest import LAYERS, SMALL

from reloadd import Ack, Reject
from tests.containerd_images._helpers import Harness
from tests.infra import Containerd, ImageSpec, write_docker_archive, write_oci_archive

pytestmark = pytest.mark.timeout(180)

WRITERS = {"oci": write_oci_archive, "docker": write_docker_archive}


def _spec(name: str, layers: int) -> ImageSpec:
    return ImageSpec(f"example.com/{name}:v1", seed=name, layers=layers, layer_size=3 << 20)


@pytest.mark.parametrize("kind", sorted(WRITERS))
async def test_the_layers_of_an_uncompressed_archive_stream_at_once(
    kind: str, ctd: Containerd, harness: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness()
    p = h.root / "three.tar"
    built = WRITERS[kind](p, [_spec(f"three{kind}", 3)])
    streaming, most = 0, 0
    two = asyncio.Event()

    async def write_blob(client: Any, ref: str, total: int, *a: Any, **k: Any) -> Any:
        nonlocal streaming, most
        if total <= SMALL:
            return await real_write_blob(client, ref, total, *a, **k)
        streaming += 1
        most = max(most, streaming)
        if streaming >= 2:
            two.set()
        with contextlib.suppress(TimeoutError):  # one at a time would wait here for nothing
            await asyncio.wait_for(two.wait(), 3)
        try:
            return await real_write_blob(client, ref, total, *a, **k)
        finally:
            streaming -= 1

    monkeypatch.setattr(_ingest, "write_blob", write_blob)
    r = (await h.handle(p))[p]
    assert isinstance(r, Ack), r
    assert most == LAYERS == 2
    img = await h.consumer.client.get_image(f"example.com/three{kind}:v1")
    assert img is not None
    assert img.target.digest == built[0].target.digest or kind == "docker"  # a docker archive's manifest is made
    assert built[0].platforms[0].chain_ids[-1] in await ctd.ctr("snapshots", "ls")
    assert await h.consumer.client.list_leases() == []


async def _ingests_drain(ctd: Containerd, within: float = 10.0) -> bool:
    """Whether containerd's active ingests are gone within ``within`` s (its GC removes a deleted lease's)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while (await ctd.ctr("content", "active")).strip().splitlines()[1:]:
        if loop.time() > end:
            return False
        await asyncio.sleep(0.2)
    return True


@pytest.mark.parametrize("kind", sorted(WRITERS))
async def test_an_uncompressed_archive_cut_inside_a_layer_is_reported_as_truncated(
    kind: str, ctd: Containerd, harness: Callable[..., Harness], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness()
    full = tmp_path / "full.tar"
    WRITERS[kind](full, [_spec(f"cut{kind}", 2)])
    data = full.read_bytes()
    p = h.root / "cut.tar"
    p.write_bytes(data[: int(len(data) * 0.7)])
    r = (await h.handle(p))[p]
    assert isinstance(r, Reject), r
    assert "truncated" in r.error and "imported again when it changes" in r.error, r.error
    assert await h.consumer.client.get_image(f"example.com/cut{kind}:v1") is None
    assert await h.consumer.client.list_leases() == []
    assert await _ingests_drain(ctd), "a partly written layer stayed in containerd's ingests"
    gc.collect()
    assert not [x for x in caplog.records if "never retrieved" in x.getMessage()]


async def test_a_file_replaced_while_its_layers_stream_is_read_as_it_was_opened(
    ctd: Containerd, harness: Callable[..., Harness], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness()
    p = h.root / "swap.tar"
    first = write_oci_archive(p, [_spec("first", 2)])
    other = tmp_path / "other.tar"
    write_oci_archive(other, [_spec("other", 2)])
    swapped = False
    real_enter = ArchiveReader.__aenter__

    async def enter(self: ArchiveReader) -> ArchiveReader:
        nonlocal swapped
        opened = await real_enter(self)
        if not swapped:
            os.rename(other, p)  # an operator's `mv` over the file once the import opened it
            swapped = True
        return opened

    monkeypatch.setattr(ArchiveReader, "__aenter__", enter)
    r = (await h.handle(p))[p]
    assert swapped
    assert not isinstance(r, Reject), r  # not "containerd refused blob": no bytes of the new file were sent
    img = await h.consumer.client.get_image("example.com/first:v1")
    assert img is not None and img.target.digest == first[0].target.digest
    assert await h.consumer.client.list_leases() == []


@pytest.mark.parametrize("kind", sorted(WRITERS))
async def test_a_plan_of_an_uncompressed_archive_names_what_its_import_writes(
    kind: str, ctd: Containerd, harness: Callable[..., Harness]
) -> None:
    h = harness()
    p = h.root / "planned.tar"
    WRITERS[kind](p, [_spec(f"planned{kind}", 3)])
    planned = await _ingest.ingest(h.consumer.client, p, "", dry_run=True)  # `reloadd plan`: hashes, writes nothing
    assert await h.consumer.client.list_ingests() == []
    lease = await h.consumer.client.create_lease(timedelta(minutes=5), {})
    done = await _ingest.ingest(h.consumer.client, p, lease)
    assert planned.index == done.index
    assert planned.written == done.written
    assert done.bytes_sent > 3 * (3 << 20) and planned.bytes_sent == 0
