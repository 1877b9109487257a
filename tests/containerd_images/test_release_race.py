"""A race the cross-consumer soak found in containerd-images, reproduced deterministically.

``a.tar`` is renamed to ``b.tar``; the engine hands over ``b.tar`` (added) before the delete of
``a.tar``, so both records hold image X. Then ``b.tar`` is rewritten with image Y, and the delete
of ``a.tar`` and the change of ``b.tar`` arrive in one batch. Each handler asks "does another file
still hold X?" from the records, sees the other's (about to change) record holding X, and keeps
it: X stayed pinned with no file behind it, until the plugin decided
releases against the batch's outcome rather than the records of paths in flight.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reloadd import Batch, Change, ChangeKind, Fingerprint, Reason
from tests.containerd_images._helpers import Harness
from tests.infra import ImageSpec, private_containerd, write_oci_archive

pytestmark = pytest.mark.timeout(60)

PIN = "io.cri-containerd.pinned"
X, Y = "example.com/race/x:v1", "example.com/race/y:v1"


def _archive(path: Path, name: str) -> None:
    tmp = path.with_name(f".{path.name}.part")
    write_oci_archive(tmp, [ImageSpec(name, seed=name, layers=1, layer_size=512)])
    os.replace(tmp, path)


async def test_rename_then_rewrite_releases_the_old_image(tmp_path: Path) -> None:
    root = tmp_path / "images"
    root.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    a, b = root / "a.tar", root / "b.tar"
    async with private_containerd(tmp_path) as ctd:
        h = Harness(ctd, root, state, {})
        try:
            _archive(a, X)
            await h.handle(a)
            os.rename(a, b)
            await h.handle(b)  # the add of b.tar settled first; a.tar's delete is still pending
            assert h.records[a].data == h.records[b].data  # both hold X now
            _archive(b, Y)
            changes = (Change(a, ChangeKind.DELETED, None, root=root),
                       Change(b, ChangeKind.MODIFIED, Fingerprint.from_stat(os.stat(b)), root=root))
            results = await h.consumer.handle(Batch("images", Reason.INOTIFY, changes))
            for c in changes:
                h.remember(c, results[c.path])
            y = await h.consumer.client.get_image(Y)
            assert y is not None and y.labels.get(PIN) == "pinned"
            x = await h.consumer.client.get_image(X)
            assert x is not None
            assert PIN not in x.labels, f"{X} still pinned for {x.labels.get('reloadd.io/source')}, no file holds it"
        finally:
            await h.consumer.close()
