"""Unpacking an image into snapshots with Snapshots.Prepare / Diff.Apply / Snapshots.Commit.

Same steps and labels as the unpacker of that containerd's own ``ctr images import``, so
the snapshot tree equals ctr's: 1.x's ``image.Unpack`` labels nothing on the snapshots,
2.x's transfer-service unpacker labels each ``containerd.io/snapshot.ref=<chain ID>``.
Only the host platform is unpacked (2.x's ctr unpacks every platform of an index; the
node runs only its own). Work is serialised per chain ID inside this process, so two
files sharing layers never extract the same layer twice.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from grpclib.const import Status

from ._client import ContainerdClient, Descriptor
from ._errors import BadImageFile, is_status
from ._oci import chain_ids

__all__ = ["ChainLocks", "UnpackPlan", "UnpackStats", "unpack"]

SNAPSHOT_REF_LABEL = "containerd.io/snapshot.ref"
APPLY_TIMEOUT_PER_MB = 2.0
"""Seconds of Diff.Apply deadline per MB of layer (plus a minute)."""


class ChainLocks:
    """One asyncio lock per chain ID, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextmanager
    def _ref(self, key: str) -> Iterator[asyncio.Lock]:
        lock, n = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, n + 1)
        try:
            yield lock
        finally:
            lock, n = self._locks[key]
            if n <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, n - 1)

    @contextmanager
    def hold(self, key: str) -> Iterator[asyncio.Lock]:
        """Reference the lock for ``key`` (acquire it with ``async with``)."""
        with self._ref(key) as lock:
            yield lock


@dataclass(frozen=True)
class UnpackPlan:
    """What to unpack: a platform manifest's config and layers."""

    config: Descriptor
    layers: list[Descriptor]
    diff_ids: list[str]


@dataclass
class UnpackStats:
    """Counters of one unpack."""

    layers_applied: int = 0
    layers_present: int = 0
    top: str = ""
    seconds: float = 0.0
    chain: list[str] = field(default_factory=list)


def _unique() -> str:
    """Like containerd's ``uniquePart()``: nanoseconds and 3 random bytes."""
    return f"{time.time_ns() % 1_000_000_000}-{base64.urlsafe_b64encode(os.urandom(3)).decode()}"


async def unpack(
    client: ContainerdClient,
    plan: UnpackPlan,
    snapshotter: str,
    lease: str,
    locks: ChainLocks,
    ready: Callable[[str], Awaitable[None]] | None = None,
) -> UnpackStats:
    """Make sure the snapshot chain of ``plan`` exists; label layers and config like containerd.

    ``ready(digest)``, when given, is awaited before a layer blob is used (it may still be
    streaming in), and before the config blob is labelled.

    Raises:
        BadImageFile: a layer does not match its diff ID or cannot be applied.
        ContainerdUnavailable: containerd went away.
    """
    t0 = time.monotonic()
    if len(plan.diff_ids) != len(plan.layers):
        raise BadImageFile(
            f"config {plan.config.digest} lists {len(plan.diff_ids)} diff_ids for {len(plan.layers)} layers"
        )
    stats = UnpackStats(chain=chain_ids(plan.diff_ids))
    ref_label = await client.major_version() >= 2
    unpacked_any = False
    for i, (layer, diff_id, chain_id) in enumerate(zip(plan.layers, plan.diff_ids, stats.chain, strict=True)):
        parent = stats.chain[i - 1] if i else ""
        with locks.hold(f"{snapshotter}/{chain_id}") as lock:
            async with lock:
                if await client.snapshot_exists(snapshotter, chain_id):
                    stats.layers_present += 1
                    continue
                if ready is not None:
                    await ready(layer.digest)
                labels = {SNAPSHOT_REF_LABEL: chain_id} if ref_label else {}
                applied = await _apply_one(client, layer, diff_id, chain_id, parent, snapshotter, lease, labels)
        if applied:
            unpacked_any = True
            stats.layers_applied += 1
            await client.set_content_labels(layer.digest, {"containerd.io/uncompressed": diff_id}, lease)
        else:
            stats.layers_present += 1
    stats.top = stats.chain[-1] if stats.chain else ""
    if unpacked_any and stats.top:
        if ready is not None:
            await ready(plan.config.digest)  # a small blob: its write may still be running beside the layers
        await client.set_content_labels(
            plan.config.digest, {f"containerd.io/gc.ref.snapshot.{snapshotter}": stats.top}, lease
        )
    stats.seconds = time.monotonic() - t0
    return stats


async def _apply_one(
    client: ContainerdClient,
    layer: Descriptor,
    diff_id: str,
    chain_id: str,
    parent: str,
    snapshotter: str,
    lease: str,
    labels: dict[str, str],
) -> bool:
    """Extract one layer into snapshot ``chain_id``; False if someone else made it meanwhile."""
    key = f"extract-{_unique()} {chain_id}"
    try:
        mounts = await client.prepare(snapshotter, key, parent, lease, labels)
    except Exception as exc:
        if is_status(exc, Status.ALREADY_EXISTS) and await client.snapshot_exists(snapshotter, chain_id):
            return False
        raise
    try:
        timeout = 60.0 + APPLY_TIMEOUT_PER_MB * layer.size / 1e6
        got = await client.apply_diff(layer, mounts, lease, timeout)
        if got != diff_id:
            raise BadImageFile(f"layer {layer.digest} unpacks to {got}, but the config says {diff_id}")
        try:
            await client.commit(snapshotter, chain_id, key, lease, labels)
        except Exception as exc:
            if is_status(exc, Status.ALREADY_EXISTS):
                await client.remove_snapshot(snapshotter, key)
                return False
            raise
    except BaseException:
        try:
            await client.remove_snapshot(snapshotter, key)
        except Exception:
            pass
        raise
    return True
