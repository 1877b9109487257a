"""Importing one tarball: ingest (with early unpack) → walk (gc labels) → unpack → image records.

The result equals ``ctr images import --all-platforms`` (same blobs, gc labels, snapshots and
image targets); on top of that the image records get the CRI labels and aliases (like CRI
PullImage), an optional pin and a label naming the source file.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from ._client import ContainerdClient, Descriptor
from ._errors import BadImageFile
from ._ingest import Ingested, ingest, load_doc
from ._oci import (
    ANN_IMAGE_NAME,
    ANN_REF_NAME,
    INDEX_TYPES,
    MANIFEST_TYPES,
    children_of,
    gc_labels,
    normalize_ref,
    platform_matches,
    repo_of,
    valid_reference,
)
from ._pipeline import EarlyUnpack, build_plan
from ._unpack import ChainLocks, UnpackPlan, unpack

__all__ = ["ImportReport", "ImportSettings", "ImportedImage", "Importer"]

LEASE_BASE_EXPIRY = timedelta(hours=1)
LEASE_LABEL = "reloadd.io/consumer"


@dataclass(frozen=True)
class ImportSettings:
    """How images are imported (from the consumer's options)."""

    snapshotter: str = "overlayfs"
    unpack: bool = True
    platforms: Sequence[Mapping[str, str]] | None = None
    """Platforms to keep (None: all present ones)."""
    unpack_platform: Mapping[str, str] = field(default_factory=lambda: {"os": "linux", "architecture": "amd64"})
    cri: bool = True
    """Create CRI's ``sha256:<config>`` and ``name@digest`` records and the managed label."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Labels for every image record (pin, source file, user labels)."""


@dataclass(frozen=True)
class ImportedImage:
    """One named image a file produced."""

    name: str
    target: Descriptor
    refs: tuple[str, ...]
    """Every image record made for it: the name, ``repo@digest`` and the ``sha256:<config>`` alias."""


@dataclass
class ImportReport:
    """What an import did."""

    images: list[ImportedImage] = field(default_factory=list)
    bytes_read: int = 0
    bytes_sent: int = 0
    blobs: int = 0
    blobs_present: int = 0
    layers_unpacked: int = 0
    seconds: float = 0.0
    ingest_seconds: float = 0.0
    unpack_seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Resolved:
    """What an archive's index resolves to, before anything is written."""

    images: list[ImportedImage] = field(default_factory=list)
    unpacks: dict[str, tuple[Descriptor, UnpackPlan]] = field(default_factory=dict)
    """Top-level target → the platform manifest to unpack and its plan."""


class _Walk:
    """Walks the index like containerd's Import handlers: names, platform filter, skip-missing."""

    def __init__(self, client: ContainerdClient, ing: Ingested, settings: ImportSettings, lease: str) -> None:
        self.client, self.ing, self.settings, self.lease = client, ing, settings, lease
        self.labels: dict[str, dict[str, str]] = {}

    async def doc(self, d: Descriptor, what: str) -> Any:
        return await load_doc(self.client, self.ing, d.digest, what, self.lease)

    async def exists(self, digest: str) -> bool:
        return digest in self.ing.written or await self.client.content_info(digest) is not None

    async def children(self, d: Descriptor, what: str) -> list[Descriptor]:
        try:
            return children_of(d, await self.doc(d, what))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadImageFile(f"{what} {d.digest} is malformed: {exc!r}") from exc

    async def visit(self, d: Descriptor, name: str) -> list[Descriptor]:
        """Label ``d``'s children; return the platform manifests kept under it."""
        if d.media_type in INDEX_TYPES:
            kids = await self.children(d, f"index of {name}")
            if self.settings.platforms is not None:
                kids = [k for k in kids if any(platform_matches(k.platform, p) for p in self.settings.platforms)]
            kids = [k for k in kids if await self.exists(k.digest)]  # skip missing platforms
            if not kids:
                raise BadImageFile(f"none of the selected platforms of {name} is in the archive")
            self.labels[d.digest] = gc_labels(kids)
            out: list[Descriptor] = []
            for k in kids:
                out += await self.visit(k, name)
            return out
        if d.media_type in MANIFEST_TYPES:
            kids = await self.children(d, f"manifest of {name}")
            for k in kids:
                if not await self.exists(k.digest):
                    raise BadImageFile(f"blob {k.digest} ({k.media_type}) of {name} is missing from the archive")
            self.labels[d.digest] = gc_labels(kids)
            return [d]
        raise BadImageFile(f"{name} points at unsupported media type {d.media_type!r}")


class Importer:
    """Imports tarballs into one containerd namespace.

    Args:
        client: The containerd client (namespace set).
        settings: Import settings.
        locks: Per-chain-ID unpack locks shared by concurrent imports.
        log: Where progress goes.
    """

    def __init__(
        self, client: ContainerdClient, settings: ImportSettings, locks: ChainLocks, log: logging.Logger
    ) -> None:
        self.client = client
        self.settings = settings
        self.locks = locks
        self.log = log

    async def import_file(self, path: Path, lease: str, extra_labels: Mapping[str, str],
                          read_from: Path | None = None,
                          gate: Callable[[], Awaitable[Mapping[str, str]]] | None = None) -> ImportReport:
        """Import ``path`` under ``lease`` (created and released by the caller).

        Args:
            read_from: Where its bytes are read, when not ``path`` itself: ``/proc/self/fd/<n>`` of the
                descriptor a signature check hashed, so a file renamed over ``path`` since is not read.
            gate: Awaited once every blob is in, before gc labels, unpacking's end and image records: a check
                that rode the read (it raises to stop the import; the caller drops the lease) and returns
                more labels for the records (the key that verified the file).
        """
        t0 = time.monotonic()
        rep = ImportReport()
        docs: dict[str, bytes] = {}
        early: EarlyUnpack | None = None
        if self.settings.unpack:
            early = EarlyUnpack(
                self.client,
                docs,
                self.settings.unpack_platform,
                self.settings.platforms,
                self.settings.snapshotter,
                lease,
                self.locks,
            )
        try:
            ing = await ingest(self.client, read_from or path, lease, early, docs)
            rep.ingest_seconds = time.monotonic() - t0
            if early is not None:
                early.ingest_finished()
            if gate is not None:
                extra_labels = {**extra_labels, **(await gate())}
            await self._finish(path, ing, lease, extra_labels, rep, early)
        finally:
            if early is not None:
                await early.cancel()
        rep.seconds = time.monotonic() - t0
        return rep

    async def _finish(
        self,
        path: Path,
        ing: Ingested,
        lease: str,
        extra_labels: Mapping[str, str],
        rep: ImportReport,
        early: EarlyUnpack | None,
    ) -> None:
        rep.bytes_read, rep.bytes_sent = ing.bytes_read, ing.bytes_sent
        rep.blobs, rep.blobs_present = ing.blobs, ing.blobs_present
        walk = _Walk(self.client, ing, self.settings, lease)
        resolved = await self._resolve(walk, rep)
        for digest, labels in walk.labels.items():
            await self.client.set_content_labels(digest, labels, lease)
        if self.settings.unpack:
            for chosen, plan in resolved.unpacks.values():
                t = time.monotonic()
                st = await early.result_for(chosen.digest) if early is not None else None
                if st is None:
                    st = await unpack(self.client, plan, self.settings.snapshotter, lease, self.locks)
                rep.layers_unpacked += st.layers_applied
                rep.unpack_seconds += time.monotonic() - t
        # Records last: kubelet never sees an image whose blobs or snapshots are not there yet.
        labels = self.record_labels(extra_labels)
        for image in resolved.images:
            d = image.target
            target = Descriptor(d.media_type, d.digest, d.size)
            await _all(self.client.upsert_image(ref, target, labels, lease) for ref in image.refs)
            rep.images.append(image)
            self.log.info("Imported image %s (%s) from %s", image.name, d.digest, path)

    def record_labels(self, extra_labels: Mapping[str, str]) -> dict[str, str]:
        """The labels every image record of an import gets."""
        labels = dict(self.settings.labels)
        labels.update(extra_labels)
        if self.settings.cri:
            labels["io.cri-containerd.image"] = "managed"
        return labels

    async def images_of(self, ing: Ingested, rep: ImportReport) -> list[ImportedImage]:
        """The image records importing ``ing`` makes, found reading only (``reloadd plan``)."""
        return (await self._resolve(_Walk(self.client, ing, self.settings, ""), rep)).images

    async def _resolve(self, walk: _Walk, rep: ImportReport) -> _Resolved:
        """Names, platform manifests, unpack plans and record names of an ingested archive (reads only)."""
        top = await walk.children(walk.ing.index, "index.json")
        named = self._names(top, rep)
        if not named:
            raise BadImageFile(
                "no image names in the archive (index.json needs io.containerd.image.name or a "
                "full reference in org.opencontainers.image.ref.name; docker archives RepoTags)"
            )
        manifests: dict[str, list[Descriptor]] = {}
        for name, d in named:
            if d.digest not in manifests:
                if not await walk.exists(d.digest):
                    raise BadImageFile(f"index.json lists {d.digest} for {name}, but the blob is missing")
                manifests[d.digest] = await walk.visit(d, name)
        out = _Resolved()
        for target, mans in manifests.items():
            want = self.settings.unpack_platform
            chosen = next((m for m in mans if platform_matches(m.platform, want)), None)
            if chosen is None:
                continue
            doc = await walk.doc(chosen, "manifest")
            cfg_desc = doc.get("config") if isinstance(doc, dict) else None
            cfg = await walk.doc(Descriptor.from_json(cfg_desc), "config") if isinstance(cfg_desc, dict) else None
            plan = build_plan(chosen, doc, cfg, want)
            if plan is not None:
                out.unpacks[target] = (chosen, plan)
        for name, d in named:
            refs = [name]
            unpacking = out.unpacks.get(d.digest)
            if self.settings.cri:
                if "@" not in name:
                    refs.append(f"{repo_of(name)}@{d.digest}")
                if unpacking is not None:
                    refs.append(unpacking[1].config.digest)
            out.images.append(ImportedImage(name, Descriptor(d.media_type, d.digest, d.size), tuple(refs)))
        return out

    def _names(self, top: list[Descriptor], rep: ImportReport) -> list[tuple[str, Descriptor]]:
        out: list[tuple[str, Descriptor]] = []
        seen: set[str] = set()
        for d in top:
            name = d.annotations.get(ANN_IMAGE_NAME, "")
            if not name:
                ref = d.annotations.get(ANN_REF_NAME, "")
                if ref and any(c in ref for c in "/.") and valid_reference(ref):
                    name = normalize_ref(ref)
                elif ref:
                    rep.warnings.append(f"ignoring {d.digest}: ref.name {ref!r} is a bare tag, not an image name")
                    continue
            if not name:
                continue
            if not valid_reference(name):
                raise BadImageFile(f"invalid image name {name!r} in index.json")
            if name not in seen:
                seen.add(name)
                out.append((name, d))
        return out


async def _all(calls: Iterable[Awaitable[None]]) -> None:
    """Await ``calls`` at once (an image's records: each a round trip or two and a containerd transaction); the
    first error is raised once the others are cancelled."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def lease_expiry(size: int) -> timedelta:
    """A lease long enough for a file of ``size`` bytes (1 h plus 1 s per 5 MB)."""
    return LEASE_BASE_EXPIRY + timedelta(seconds=size / 5e6)
