"""The import leases of one consumer: one per import, dropped after it; an earlier run's found and dropped."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from reloadd import ConsumerError

from ._client import ContainerdClient
from ._importer import LEASE_LABEL, lease_expiry

__all__ = ["INSTANCE_LABEL", "Leases"]

INSTANCE_LABEL = "reloadd.io/instance"
"""Names the run that made a lease, so a later run knows which ones an interrupted import left."""


class Leases:
    """The leases a consumer's imports hold their content and snapshots under.

    A lease containerd could not drop (it was away) is remembered and dropped before the next import.

    Args:
        client: The consumer's containerd client (its channel is made on first use).
        consumer: The consumer's name (labelled on each lease).
        log: The consumer's logger.
    """

    def __init__(self, client: Callable[[], ContainerdClient], consumer: str, log: logging.Logger) -> None:
        self._client, self._consumer, self._log = client, consumer, log
        self._stale: set[str] = set()
        self._instance = uuid.uuid4().hex[:12]

    async def create(self, size: int) -> str:
        """A lease for the import of a file of ``size`` bytes (its expiry grows with the size)."""
        return await self._client().create_lease(
            lease_expiry(size), {LEASE_LABEL: self._consumer, INSTANCE_LABEL: self._instance}
        )

    async def drop(self, lease: str, sync: bool = False) -> None:
        """Delete ``lease`` (``sync``: containerd collects what it held at once), or remember it for later."""
        try:
            await self._client().delete_lease(lease, sync=sync)
        except ConsumerError:
            self._stale.add(lease)  # containerd is away; dropped before the next import

    async def drop_stale(self) -> None:
        """Delete the leases an earlier :meth:`drop` could not."""
        # sync: containerd collects what the failed import left (partial ingests) right away.
        for lease in list(self._stale):
            await self._client().delete_lease(lease, sync=True)
            self._stale.discard(lease)

    async def delete_left_behind(self) -> None:
        """Delete leases an earlier run of this consumer left behind (crash mid-import)."""
        client = self._client()
        for lease, labels in await client.list_leases():
            if labels.get(LEASE_LABEL) == self._consumer and labels.get(INSTANCE_LABEL) != self._instance:
                self._log.info("Deleting lease %s left by an interrupted import", lease)
                await client.delete_lease(lease, sync=True)
