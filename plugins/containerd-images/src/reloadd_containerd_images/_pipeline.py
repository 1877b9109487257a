"""Unpacking while the tarball is still streaming in.

``ctr`` ingests the whole tarball, then unpacks. When the index, the unpack platform's
manifest and its config come before the layers (the usual order in OCI archives), the
layer chain is known early: layer N can be extracted by containerd while layer N+1 is
still being sent. :class:`EarlyUnpack` does that for the first image of a file; whatever
it cannot plan early is unpacked afterwards as usual. The end state is the same.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ._client import ContainerdClient, Descriptor
from ._errors import BadImageFile
from ._oci import INDEX_TYPES, MANIFEST_TYPES, platform_matches
from ._unpack import ChainLocks, UnpackPlan, UnpackStats, unpack

__all__ = ["EarlyUnpack", "build_plan"]


def build_plan(manifest: Descriptor, doc: Any, config_doc: Any, want: Mapping[str, str]) -> UnpackPlan | None:
    """The unpack plan of a platform manifest (None when its config is for another platform).

    Raises:
        BadImageFile: the manifest or config lacks the fields unpacking needs.
    """
    try:
        config = Descriptor.from_json(doc["config"])
        layers = [Descriptor.from_json(x) for x in doc.get("layers") or []]
        diff_ids = [str(x) for x in config_doc["rootfs"]["diff_ids"]]
        os_ = str(config_doc.get("os", ""))
        plat = {
            "os": os_,
            "architecture": str(config_doc.get("architecture", "")),
            "variant": str(config_doc.get("variant", "")),
        }
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BadImageFile(f"manifest {manifest.digest} or its config is malformed: {exc!r}") from exc
    if os_ and not platform_matches(plat, want):
        return None
    return UnpackPlan(config, layers, diff_ids)


class _NotInArchive(Exception):
    """Internal: a layer never arrived; the regular unpack path decides what that means."""


class EarlyUnpack:
    """Plans and runs the unpack of a file's first image as soon as the needed documents arrived.

    Args:
        client: The containerd client.
        docs: The ingest's JSON document cache (digest → bytes), filled as blobs arrive.
        want: The platform to unpack.
        platforms: The platforms the import keeps (None: all).
        snapshotter: Snapshotter name.
        lease: The import's lease.
        locks: Per-chain-ID locks.
    """

    def __init__(
        self,
        client: ContainerdClient,
        docs: Mapping[str, bytes],
        want: Mapping[str, str],
        platforms: Sequence[Mapping[str, str]] | None,
        snapshotter: str,
        lease: str,
        locks: ChainLocks,
    ) -> None:
        self.client, self.docs, self.want, self.platforms = client, docs, want, platforms
        self.snapshotter, self.lease, self.locks = snapshotter, lease, locks
        self.index: str | None = None
        self.manifest: str | None = None
        self.task: asyncio.Task[UnpackStats] | None = None
        self._committed: set[str] = set()
        self._events: dict[str, asyncio.Event] = {}
        self._done = False
        self._gave_up = False

    # -- fed by the ingest ------------------------------------------------------------------
    def index_read(self, digest: str) -> None:
        """The archive's index.json (now in ``docs``)."""
        self.index = digest
        self._try_plan()

    def blob_committed(self, digest: str) -> None:
        """A blob is in containerd (written or already present)."""
        self._committed.add(digest)
        ev = self._events.get(digest)
        if ev is not None:
            ev.set()
        if self.task is None and digest in self.docs:
            self._try_plan()

    def ingest_finished(self) -> None:
        """No more blobs will come: wake a waiting unpack."""
        self._done = True
        for ev in self._events.values():
            ev.set()

    # -- used by the importer ---------------------------------------------------------------
    async def result_for(self, manifest: str) -> UnpackStats | None:
        """The early unpack's stats if it handled ``manifest`` successfully, else None (unpack again)."""
        if self.task is None or self.manifest != manifest:
            return None
        try:
            return await self.task
        except _NotInArchive:
            return None

    async def cancel(self) -> None:
        """Stop the early unpack if still running; its partial work belongs to the lease."""
        if self.task is None:
            return
        if not self.task.done():
            self.task.cancel()
        await asyncio.wait([self.task])  # our own cancellation still propagates
        if not self.task.cancelled():
            self.task.exception()  # retrieved: reported (if at all) through result_for()

    # -- internals ----------------------------------------------------------------------------
    def _doc(self, digest: str) -> Any:
        raw = self.docs.get(digest)
        return None if raw is None else json.loads(raw)

    def _try_plan(self) -> None:
        if self.task is not None or self._gave_up or self.index is None:
            return
        try:
            plan = self._plan()
        except Exception:  # malformed input: the regular path reports it properly
            self._gave_up = True
            return
        if plan is not None:
            self.task = asyncio.create_task(
                unpack(self.client, plan, self.snapshotter, self.lease, self.locks, ready=self._ready)
            )

    def _plan(self) -> UnpackPlan | None:
        index = self._doc(str(self.index))
        top = [Descriptor.from_json(d) for d in index.get("manifests") or []]
        if not top:
            self._gave_up = True
            return None
        d = top[0]
        if d.media_type in INDEX_TYPES:
            idx = self._doc(d.digest)
            if idx is None:
                return None
            kids = [Descriptor.from_json(k) for k in idx.get("manifests") or []]
            if self.platforms is not None:
                kids = [k for k in kids if any(platform_matches(k.platform, p) for p in self.platforms)]
            match = next((k for k in kids if platform_matches(k.platform, self.want)), None)
            if match is None:
                self._gave_up = True
                return None
            d = match
        if d.media_type not in MANIFEST_TYPES:
            self._gave_up = True
            return None
        doc = self._doc(d.digest)
        if doc is None:
            return None
        config_doc = self._doc(str(doc["config"]["digest"]))
        if config_doc is None:
            return None
        plan = build_plan(d, doc, config_doc, self.want)
        if plan is None:
            self._gave_up = True
        else:
            self.manifest = d.digest
        return plan

    async def _ready(self, digest: str) -> None:
        while digest not in self._committed:
            if self._done:
                raise _NotInArchive(digest)
            ev = self._events.setdefault(digest, asyncio.Event())
            await ev.wait()
