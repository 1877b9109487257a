"""Helpers for the containerd-images tests: a consumer harness and namespace dumps."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from reloadd_containerd_images import ContainerdImagesConsumer, create
from reloadd_containerd_images._client import ContainerdClient
from reloadd_containerd_images._proto.containerd.services.content.v1 import content_pb2 as cpb
from reloadd_containerd_images._proto.containerd.services.snapshots.v1 import snapshots_pb2 as spb

from reloadd import (
    Ack,
    Batch,
    Change,
    ChangeKind,
    ConsumerContext,
    DriftMode,
    Fingerprint,
    PathRecord,
    Reason,
    Reject,
    Result,
)
from tests.infra import Containerd


class Harness:
    """A consumer plus the engine-side bits a test needs (records, triggers)."""

    def __init__(self, ctd: Containerd, root: Path, state: Path, options: dict[str, Any]) -> None:
        self.ctd = ctd
        self.root = root
        self.records: dict[Path, PathRecord] = {}
        self.triggered: list[Path] = []
        self.ctx = ConsumerContext(
            name="images",
            paths=(root,),
            # No engine here to run the consumer's far-side source: its start-up check is what runs.
            options={"address": ctd.address, **options},
            drift=DriftMode.OFF,
            state_dir=state,
            records=self.records,
            trigger=lambda paths: self.triggered.extend(paths or []),
            logger=logging.getLogger("reloadd.consumer.images"),
        )
        consumer = create(self.ctx)
        assert isinstance(consumer, ContainerdImagesConsumer)
        self.consumer = consumer

    async def handle(self, *paths: Path, kind: ChangeKind | None = None, reason: Reason = Reason.INOTIFY
                     ) -> dict[Path, Result]:
        """Hand paths over like the engine does and record Acks as the engine would."""
        changes = []
        for p in paths:
            k = kind or (ChangeKind.MODIFIED if p in self.records else ChangeKind.ADDED)
            fp = Fingerprint.from_stat(os.stat(p)) if k is not ChangeKind.DELETED else None
            changes.append(Change(p, k, fp, root=self.root))
        results = dict(await self.consumer.handle(Batch("images", reason, tuple(changes))))
        for c in changes:
            self.remember(c, results[c.path])
        return results

    def remember(self, c: Change, r: Result) -> None:
        if isinstance(r, Ack):
            if c.kind is ChangeKind.DELETED:
                self.records.pop(c.path, None)
            else:
                self.records[c.path] = PathRecord(c.fingerprint, None, r.data)
        elif isinstance(r, Reject):  # as the work queue does: no data of its own keeps the previous data
            prev = self.records.get(c.path)
            data = r.data if r.data is not None else (prev.data if prev is not None else None)
            self.records[c.path] = PathRecord(c.fingerprint, None, data, r.error)


async def dump(address: str, namespace: str, snapshotter: str = "overlayfs") -> dict[str, Any]:
    """Images, blobs (with labels) and snapshots of a namespace, for comparisons."""
    c = ContainerdClient(address, namespace)
    try:
        images = sorted((i.name, i.target.media_type, i.target.digest, i.target.size) for i in await c.list_images())
        labels = {i.name: dict(i.labels) for i in await c.list_images()}
        content = []
        async with c.content.List.open(metadata=c.md()) as s:
            await s.send_message(cpb.ListContentRequest(), end=True)
            async for r in s:
                content += [(i.digest, i.size, tuple(sorted(i.labels.items()))) for i in r.info]
        snaps = []
        async with c.snapshots.List.open(metadata=c.md()) as s:
            await s.send_message(spb.ListSnapshotsRequest(snapshotter=snapshotter), end=True)
            async for r in s:
                snaps += [(i.name, i.parent, int(i.kind), tuple(sorted(i.labels.items()))) for i in r.info]
        return {"images": images, "labels": labels, "content": sorted(content), "snapshots": sorted(snaps)}
    finally:
        c.close()


async def sync_gc(address: str) -> None:
    """Run containerd's garbage collector now (deleting a lease with sync=True does)."""
    from datetime import timedelta

    c = ContainerdClient(address, "default")
    try:
        lease = await c.create_lease(timedelta(minutes=1), {})
        await c.delete_lease(lease, sync=True)
    finally:
        c.close()


def names(d: dict[str, Any]) -> set[str]:
    return {i[0] for i in d["images"]}


def without(d: dict[str, Any], drop: Iterable[str]) -> list[tuple[Any, ...]]:
    return [i for i in d["images"] if i[0] not in set(drop)]
