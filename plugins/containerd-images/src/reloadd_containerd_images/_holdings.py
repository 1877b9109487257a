"""Which file holds which image names now, and the release (``on_delete``) of those no file holds."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from reloadd import PathRecord

from ._client import ContainerdClient
from ._settings import Settings
from ._state import PIN_LABEL, SOURCE_LABEL, state_of

__all__ = ["Holdings"]


class Holdings:
    """The image names each file holds, and their release once no file holds them.

    The freshest known image names per file are kept here, ahead of the engine's records (which are
    only updated once a whole batch is acknowledged); release decisions read them under one lock, so
    a rename and a rewrite handled side by side cannot both keep an image.

    Args:
        client: The consumer's containerd client (its channel is made on first use).
        records: What the engine remembers per path (kept current).
        settings: The consumer's options (``on_delete``).
        log: The consumer's logger.
    """

    def __init__(
        self,
        client: Callable[[], ContainerdClient],
        records: Mapping[Path, PathRecord],
        settings: Settings,
        log: logging.Logger,
    ) -> None:
        self._client, self._records, self._settings, self._log = client, records, settings, log
        self._held: dict[Path, set[str]] = {}
        self._lock = asyncio.Lock()

    def held_elsewhere(self, but: Path) -> set[str]:
        """Image names some file other than ``but`` holds now (in-flight results included)."""
        held: set[str] = set()
        for p, rec in self._records.items():
            if p != but and p not in self._held:
                st = state_of(rec.data)
                if st is not None:
                    held |= st.refs
        for p, refs in self._held.items():
            if p != but:
                held |= refs
        return held

    async def settle(self, path: Path, now: set[str], dropped: set[str], namespace: str | None = None) -> None:
        """Record what ``path`` holds now, then release what it dropped and nobody else holds."""
        async with self._lock:
            self._held[path] = now
            await self._release(path, dropped, namespace=namespace)

    async def _release(self, path: Path, refs: set[str], namespace: str | None = None) -> None:
        """Apply ``on_delete`` to ``refs`` that no other file holds (call under the release lock)."""
        gone = sorted(refs - self.held_elsewhere(path))
        if not gone or self._settings.on_delete == "keep":
            return
        client = self._client()
        for ref in gone:
            if self._settings.on_delete == "remove":
                await client.delete_image(ref, namespace=namespace)
            else:
                await client.set_image_labels(ref, {PIN_LABEL: None, SOURCE_LABEL: None}, namespace=namespace)
        self._log.info(
            "Released %d image record(s) of %s (%s): %s", len(gone), path, self._settings.on_delete, ", ".join(gone)
        )
