"""A minimal asyncio containerd client on grpclib (native API + CRI ``runtime.v1`` ImageService).

Every namespaced call carries the ``containerd-namespace`` header; calls made for an
import also carry ``containerd-lease`` so new content and snapshots belong to the
lease (protected from GC) until the image records reference them.

Failures are mapped here, at the boundary: "not found" / "already exists" answers
become return values where the caller expects them, everything else goes through
:func:`map_grpc_error`.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from google.protobuf import empty_pb2, field_mask_pb2
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ._channel import coalescing_channel
from ._errors import BadImageFile, is_status, map_grpc_error
from ._proto.containerd.services.content.v1 import content_grpc
from ._proto.containerd.services.content.v1 import content_pb2 as cpb
from ._proto.containerd.services.diff.v1 import diff_grpc
from ._proto.containerd.services.diff.v1 import diff_pb2 as dpb
from ._proto.containerd.services.images.v1 import images_grpc
from ._proto.containerd.services.images.v1 import images_pb2 as ipb
from ._proto.containerd.services.leases.v1 import leases_grpc
from ._proto.containerd.services.leases.v1 import leases_pb2 as lpb
from ._proto.containerd.services.snapshots.v1 import snapshots_grpc
from ._proto.containerd.services.snapshots.v1 import snapshots_pb2 as spb
from ._proto.containerd.services.version.v1 import version_grpc
from ._proto.containerd.types import descriptor_pb2, mount_pb2
from ._proto.cri.runtime.v1 import api_grpc as cri_grpc
from ._proto.cri.runtime.v1 import api_pb2 as cri_pb

__all__ = ["CRI_NAMESPACE", "ContainerdClient", "Descriptor", "ImageRecord"]

NS_HEADER = "containerd-namespace"
LEASE_HEADER = "containerd-lease"
CRI_NAMESPACE = "k8s.io"
"""The namespace the CRI plugin keeps its images in."""

T = TypeVar("T")


@dataclass(frozen=True)
class Descriptor:
    """An OCI content descriptor (platform kept for index children; not sent on the wire)."""

    media_type: str
    digest: str
    size: int
    annotations: Mapping[str, str] = field(default_factory=dict)
    platform: Mapping[str, str] | None = None

    def to_pb(self) -> descriptor_pb2.Descriptor:
        """As ``containerd.types.Descriptor``."""
        return descriptor_pb2.Descriptor(
            media_type=self.media_type, digest=self.digest, size=self.size, annotations=dict(self.annotations)
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Descriptor:
        """From an OCI JSON descriptor (raises KeyError/TypeError/ValueError when malformed)."""
        return cls(
            str(d.get("mediaType", "")),
            str(d["digest"]),
            int(d["size"]),
            {str(k): str(v) for k, v in (d.get("annotations") or {}).items()},
            d.get("platform"),
        )


@dataclass(frozen=True)
class ImageRecord:
    """An image record as containerd stores it."""

    name: str
    target: Descriptor
    labels: Mapping[str, str]


def _image_from_pb(img: ipb.Image) -> ImageRecord:
    t = img.target
    return ImageRecord(img.name, Descriptor(t.media_type, t.digest, t.size), dict(img.labels))


class ContainerdClient:
    """One gRPC channel to containerd's socket, scoped to a namespace.

    Args:
        address: The unix socket path.
        namespace: The containerd namespace for native calls.
        timeout: Deadline for unary calls, in seconds.
    """

    def __init__(self, address: str, namespace: str, timeout: float = 60.0) -> None:
        self.address = address
        self.namespace = namespace
        self.timeout = timeout
        self.channel = coalescing_channel(address)
        self.content = content_grpc.ContentStub(self.channel)
        self.images = images_grpc.ImagesStub(self.channel)
        self.leases = leases_grpc.LeasesStub(self.channel)
        self.snapshots = snapshots_grpc.SnapshotsStub(self.channel)
        self.diff = diff_grpc.DiffStub(self.channel)
        self.version_stub = version_grpc.VersionStub(self.channel)
        self.cri = cri_grpc.ImageServiceStub(self.channel)

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()

    def md(self, lease: str | None = None, namespace: str | None = None) -> dict[str, str]:
        """gRPC metadata for a call (namespace, and the lease when given)."""
        m = {NS_HEADER: namespace or self.namespace}
        if lease:
            m[LEASE_HEADER] = lease
        return m

    async def _call(self, aw: Awaitable[T], what: str) -> T:
        try:
            return await aw
        except Exception as exc:
            raise map_grpc_error(exc, what) from exc

    async def version(self) -> str:
        """containerd's version string (a cheap liveness check)."""
        r = await self._call(self.version_stub.Version(empty_pb2.Empty(), timeout=self.timeout), "Version")
        return str(r.version)

    async def major_version(self) -> int:
        """containerd's major version (``2`` for ``2.1.9+unknown``; 1 when unparseable)."""
        v = (await self.version()).lstrip("v")
        head = v.split(".", 1)[0]
        return int(head) if head.isdigit() else 1

    # -- leases --------------------------------------------------------------------------------
    async def create_lease(self, expire: timedelta, labels: Mapping[str, str]) -> str:
        """Create a lease expiring after ``expire`` (``containerd.io/gc.expire``, RFC 3339)."""
        exp = (datetime.now(UTC) + expire).replace(microsecond=0).isoformat().replace("+00:00", "Z")
        lid = f"reloadd-{uuid.uuid4().hex[:16]}"
        req = lpb.CreateRequest(id=lid, labels={"containerd.io/gc.expire": exp, **labels})
        r = await self._call(self.leases.Create(req, metadata=self.md(), timeout=self.timeout), "Leases.Create")
        return str(r.lease.id)

    async def delete_lease(self, lease_id: str, sync: bool = False) -> None:
        """Delete a lease (a missing one is fine); ``sync`` runs the GC before returning."""
        try:
            await self.leases.Delete(
                lpb.DeleteRequest(id=lease_id, sync=sync), metadata=self.md(), timeout=self.timeout
            )
        except Exception as exc:
            if is_status(exc, Status.NOT_FOUND):
                return
            raise map_grpc_error(exc, f"Leases.Delete {lease_id}") from exc

    async def list_leases(self, *filters: str) -> list[tuple[str, dict[str, str]]]:
        """``(id, labels)`` of the leases matching ``filters``."""
        r = await self._call(
            self.leases.List(lpb.ListRequest(filters=list(filters)), metadata=self.md(), timeout=self.timeout),
            "Leases.List",
        )
        return [(str(x.id), dict(x.labels)) for x in r.leases]

    # -- content -------------------------------------------------------------------------------
    async def content_info(self, digest: str) -> dict[str, str] | None:
        """The labels of a blob, or None when the namespace does not have it."""
        try:
            r = await self.content.Info(cpb.InfoRequest(digest=digest), metadata=self.md(), timeout=self.timeout)
        except Exception as exc:
            if is_status(exc, Status.NOT_FOUND):
                return None
            raise map_grpc_error(exc, f"Content.Info {digest}") from exc
        return dict(r.info.labels)

    async def read_blob(self, digest: str, limit: int, lease: str | None = None) -> bytes:
        """Read a whole blob (at most ``limit`` bytes; more raises ValueError)."""
        out = bytearray()
        try:
            async with self.content.Read.open(metadata=self.md(lease), timeout=self.timeout) as s:
                await s.send_message(cpb.ReadContentRequest(digest=digest), end=True)
                async for r in s:
                    out += r.data
                    if len(out) > limit:
                        raise ValueError(f"blob {digest} is larger than {limit} bytes")
        except ValueError:
            raise
        except Exception as exc:
            raise map_grpc_error(exc, f"Content.Read {digest}") from exc
        return bytes(out)

    async def set_content_labels(self, digest: str, labels: Mapping[str, str], lease: str | None = None) -> None:
        """Set (only) these labels on a blob."""
        if not labels:
            return
        req = cpb.UpdateRequest(
            info=cpb.Info(digest=digest, labels=dict(labels)),
            update_mask=field_mask_pb2.FieldMask(paths=[f"labels.{k}" for k in labels]),
        )
        await self._call(
            self.content.Update(req, metadata=self.md(lease), timeout=self.timeout), f"Content.Update {digest}"
        )

    async def list_ingests(self) -> list[str]:
        """Refs of unfinished ingests in the namespace."""
        r = await self._call(
            self.content.ListStatuses(cpb.ListStatusesRequest(), metadata=self.md(), timeout=self.timeout),
            "Content.ListStatuses",
        )
        return [str(s.ref) for s in r.statuses]

    # -- images --------------------------------------------------------------------------------
    async def get_image(self, name: str, namespace: str | None = None) -> ImageRecord | None:
        """The image record ``name``, or None."""
        try:
            r = await self.images.Get(
                ipb.GetImageRequest(name=name), metadata=self.md(namespace=namespace), timeout=self.timeout
            )
        except Exception as exc:
            if is_status(exc, Status.NOT_FOUND):
                return None
            raise map_grpc_error(exc, f"Images.Get {name}") from exc
        return _image_from_pb(r.image)

    async def list_images(self, *filters: str) -> list[ImageRecord]:
        """All image records matching ``filters``."""
        r = await self._call(
            self.images.List(ipb.ListImagesRequest(filters=list(filters)), metadata=self.md(), timeout=self.timeout),
            "Images.List",
        )
        return [_image_from_pb(i) for i in r.images]

    async def upsert_image(
        self,
        name: str,
        target: Descriptor,
        labels: Mapping[str, str],
        lease: str | None = None,
        namespace: str | None = None,
    ) -> None:
        """Point ``name`` at ``target`` and set ``labels`` (others kept); create it if missing."""
        img = ipb.Image(name=name, target=target.to_pb(), labels=dict(labels))
        mask = field_mask_pb2.FieldMask(paths=["target", *(f"labels.{k}" for k in labels)])
        md = self.md(lease, namespace)
        for _ in range(3):
            try:
                await self.images.Update(
                    ipb.UpdateImageRequest(image=img, update_mask=mask), metadata=md, timeout=self.timeout
                )
                return
            except Exception as exc:
                if not is_status(exc, Status.NOT_FOUND):
                    raise map_grpc_error(exc, f"Images.Update {name}") from exc
            try:
                await self.images.Create(ipb.CreateImageRequest(image=img), metadata=md, timeout=self.timeout)
                return
            except Exception as exc:
                if not is_status(exc, Status.ALREADY_EXISTS):  # lost a race with a creator: update
                    raise map_grpc_error(exc, f"Images.Create {name}") from exc
        raise map_grpc_error(RuntimeError("create/update race did not settle"), f"Images {name}")

    async def set_image_labels(self, name: str, labels: Mapping[str, str | None], namespace: str | None = None) -> bool:
        """Set labels (value None removes the key) on an existing image; False if it is gone.

        The request always carries the whole image (name, current target, labels): containerd 2.x
        converts the request's target before it reads the field mask, and a request without one
        makes it dereference nil and panic (2.1.9 crashes). The mask still names only the labels,
        so a target changed by someone else between the read and the update is left alone.
        """
        if not labels:
            return True
        current = await self.get_image(name, namespace)
        if current is None:
            return False
        merged = {**current.labels, **{k: v for k, v in labels.items() if v is not None}}
        for k, v in labels.items():
            if v is None:
                merged.pop(k, None)
        img = ipb.Image(name=name, target=current.target.to_pb(), labels=merged)
        mask = field_mask_pb2.FieldMask(paths=[f"labels.{k}" for k in labels])
        try:
            await self.images.Update(
                ipb.UpdateImageRequest(image=img, update_mask=mask),
                metadata=self.md(namespace=namespace),
                timeout=self.timeout,
            )
        except Exception as exc:
            if is_status(exc, Status.NOT_FOUND):
                return False
            raise map_grpc_error(exc, f"Images.Update {name}") from exc
        return True

    async def delete_image(self, name: str, namespace: str | None = None) -> None:
        """Delete an image record (a missing one is fine)."""
        try:
            await self.images.Delete(
                ipb.DeleteImageRequest(name=name), metadata=self.md(namespace=namespace), timeout=self.timeout
            )
        except Exception as exc:
            if is_status(exc, Status.NOT_FOUND):
                return
            raise map_grpc_error(exc, f"Images.Delete {name}") from exc

    # -- snapshots / diff ----------------------------------------------------------------------
    async def snapshot_exists(self, snapshotter: str, key: str) -> bool:
        """Whether snapshot ``key`` exists."""
        try:
            await self.snapshots.Stat(
                spb.StatSnapshotRequest(snapshotter=snapshotter, key=key), metadata=self.md(), timeout=self.timeout
            )
        except Exception as exc:
            if is_status(exc, Status.NOT_FOUND):
                return False
            raise map_grpc_error(exc, f"Snapshots.Stat {key}") from exc
        return True

    async def prepare(
        self, snapshotter: str, key: str, parent: str, lease: str, labels: Mapping[str, str] | None = None
    ) -> Sequence[mount_pb2.Mount]:
        """Snapshots.Prepare; raises GRPCError ALREADY_EXISTS unmapped (callers handle it)."""
        try:
            r = await self.snapshots.Prepare(
                spb.PrepareSnapshotRequest(snapshotter=snapshotter, key=key, parent=parent, labels=dict(labels or {})),
                metadata=self.md(lease),
                timeout=self.timeout,
            )
        except GRPCError as exc:
            if exc.status == Status.ALREADY_EXISTS:
                raise
            raise map_grpc_error(exc, f"Snapshots.Prepare {key}") from exc
        except Exception as exc:
            raise map_grpc_error(exc, f"Snapshots.Prepare {key}") from exc
        return list(r.mounts)

    async def commit(
        self, snapshotter: str, name: str, key: str, lease: str, labels: Mapping[str, str] | None = None
    ) -> None:
        """Snapshots.Commit; raises GRPCError ALREADY_EXISTS unmapped."""
        try:
            await self.snapshots.Commit(
                spb.CommitSnapshotRequest(snapshotter=snapshotter, name=name, key=key, labels=dict(labels or {})),
                metadata=self.md(lease),
                timeout=self.timeout,
            )
        except GRPCError as exc:
            if exc.status == Status.ALREADY_EXISTS:
                raise
            raise map_grpc_error(exc, f"Snapshots.Commit {name}") from exc
        except Exception as exc:
            raise map_grpc_error(exc, f"Snapshots.Commit {name}") from exc

    async def remove_snapshot(self, snapshotter: str, key: str) -> None:
        """Remove a snapshot (a missing one is fine)."""
        try:
            await self.snapshots.Remove(
                spb.RemoveSnapshotRequest(snapshotter=snapshotter, key=key), metadata=self.md(), timeout=self.timeout
            )
        except Exception as exc:
            if is_status(exc, Status.NOT_FOUND):
                return
            raise map_grpc_error(exc, f"Snapshots.Remove {key}") from exc

    async def apply_diff(self, layer: Descriptor, mounts: Sequence[mount_pb2.Mount], lease: str, timeout: float) -> str:
        """Diff.Apply a layer onto mounts; returns the uncompressed digest (diff ID)."""
        try:
            r = await self.diff.Apply(
                dpb.ApplyRequest(diff=layer.to_pb(), mounts=list(mounts)), metadata=self.md(lease), timeout=timeout
            )
        except GRPCError as exc:
            if exc.status in (Status.UNAVAILABLE, Status.DEADLINE_EXCEEDED, Status.CANCELLED):
                raise map_grpc_error(exc, f"Diff.Apply {layer.digest}") from exc
            # containerd read and rejected the layer data itself.
            raise BadImageFile(f"layer {layer.digest} cannot be unpacked: {exc.message}") from exc
        except Exception as exc:
            raise map_grpc_error(exc, f"Diff.Apply {layer.digest}") from exc
        return str(r.applied.digest)

    # -- CRI runtime.v1 ------------------------------------------------------------------------
    async def cri_image_id(self, ref: str) -> str | None:
        """CRI ImageStatus: the image id when present, else None."""
        req = cri_pb.ImageStatusRequest(image=cri_pb.ImageSpec(image=ref))
        r = await self._call(self.cri.ImageStatus(req, timeout=self.timeout), f"CRI ImageStatus {ref}")
        return str(r.image.id) if r.HasField("image") else None

    async def cri_pull(self, ref: str, timeout: float) -> str:
        """CRI PullImage (registry config of containerd applies); returns the image id."""
        req = cri_pb.PullImageRequest(image=cri_pb.ImageSpec(image=ref))
        r = await self._call(self.cri.PullImage(req, timeout=timeout), f"CRI PullImage {ref}")
        return str(r.image_ref)
