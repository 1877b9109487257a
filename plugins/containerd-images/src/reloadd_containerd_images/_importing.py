"""One tarball imported for the consumer: under its own lease, then counted and logged."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from ._client import CRI_NAMESPACE, ContainerdClient
from ._importer import Importer, ImportReport, ImportSettings
from ._leases import Leases
from ._oci import host_platform
from ._settings import Settings
from ._state import PIN_LABEL, SOURCE_LABEL, FileImages
from ._unpack import ChainLocks
from ._verifying import Stopped

__all__ = ["Imports"]


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


class Imports:
    """The tarball imports of one consumer.

    Args:
        client: The consumer's containerd client (its channel is made on first use).
        settings: The consumer's options (the import's snapshotter, unpack, platforms, labels).
        locks: The consumer's chain locks (two imports never unpack one chain at once).
        leases: The consumer's leases.
        stats: The consumer's counters (``bytes_imported``, ``images_imported``, ...).
        log: The consumer's logger.
    """

    def __init__(
        self,
        client: Callable[[], ContainerdClient],
        settings: Settings,
        locks: ChainLocks,
        leases: Leases,
        stats: dict[str, float],
        log: logging.Logger,
    ) -> None:
        self._client, self._locks, self._leases, self._stats, self._log = client, locks, leases, stats, log
        self.settings = ImportSettings(
            snapshotter=settings.snapshotter,
            unpack=settings.unpack,
            platforms=settings.platforms,
            unpack_platform=host_platform(),
            cri=settings.namespace == CRI_NAMESPACE,
            labels={**settings.labels, **({PIN_LABEL: "pinned"} if settings.pin else {})},
        )

    def importer(self) -> Importer:
        """An importer with the consumer's settings (``reloadd plan`` previews with one too)."""
        return Importer(self._client(), self.settings, self._locks, self._log)

    async def run(self, path: Path, labels: dict[str, str], read_from: Path | None,
                  gate: Callable[[], Awaitable[Mapping[str, str]]] | None = None) -> FileImages:
        """Import ``path`` (read from ``read_from`` when given) under a lease of its own, dropped after.

        Raises:
            Stopped: ``gate`` refused the file once its bytes were in; its lease is already gone.
            ConsumerError: the import failed.
        """
        await self._leases.drop_stale()
        t0 = time.monotonic()
        lease = await self._leases.create(os.stat(path).st_size)
        try:
            rep = await self.importer().import_file(path, lease, {SOURCE_LABEL: str(path), **labels}, read_from, gate)
        except Stopped:  # refused once its bytes were in: nothing of it may stay
            await self._leases.drop(lease, sync=True)
            lease = ""
            raise
        finally:
            if lease:
                await self._leases.drop(lease)
        self._count(path, rep, max(time.monotonic() - t0, 1e-6))
        return FileImages("tar", tuple((i.name, i.target.digest, i.refs) for i in rep.images))

    def _count(self, path: Path, rep: ImportReport, dt: float) -> None:
        """Log an import's warnings and figures; add them to the consumer's counters."""
        for w in rep.warnings:
            self._log.warning("%s: %s", path, w)
        self._stats["bytes_imported"] += rep.bytes_read
        self._stats["bytes_sent"] += rep.bytes_sent
        self._stats["images_imported"] += len(rep.images)
        self._stats["files_imported"] += 1
        self._log.info(
            "Imported %s: %d image(s), %s read, %s sent, %d of %d blobs present, %d layer(s) "
            "unpacked in %.2fs (%.1f MB/s; ingest %.2fs, unpack %.2fs)",
            path,
            len(rep.images),
            _mb(rep.bytes_read),
            _mb(rep.bytes_sent),
            rep.blobs_present,
            rep.blobs,
            rep.layers_unpacked,
            dt,
            rep.bytes_read / dt / 1e6,
            rep.ingest_seconds,
            rep.unpack_seconds,
        )
        self._stats["import_seconds"] += dt
