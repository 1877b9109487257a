"""Recorded images checked against containerd: what drifted, pins put back, files to import again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from reloadd import Backoff, PathRecord, TransientError

from ._client import CRI_NAMESPACE, ContainerdClient
from ._leases import Leases
from ._settings import Settings
from ._state import PIN_LABEL, SOURCE_LABEL, FileImages, state_of

__all__ = ["Restorer"]


class Restorer:
    """Compares what a consumer's files recorded with containerd's images, read-only or repairing pins.

    Args:
        client: The consumer's containerd client (its channel is made on first use).
        records: What the engine remembers per path (kept current).
        settings: The consumer's options (``pin``).
        leases: The consumer's leases (an interrupted import's are deleted first).
        stats: The consumer's counters (``pins_restored``, ``reimports_triggered``).
        log: The consumer's logger.
    """

    def __init__(
        self,
        client: Callable[[], ContainerdClient],
        records: Mapping[Path, PathRecord],
        settings: Settings,
        leases: Leases,
        stats: dict[str, float],
        log: logging.Logger,
    ) -> None:
        self._client, self._records, self._settings = client, records, settings
        self._leases, self._stats, self._log = leases, stats, log

    async def to_restore(self) -> list[Path]:
        """The recorded files whose images are missing or changed in containerd (missing pins are put back).

        Raises:
            TransientError: containerd cannot be reached.
        """
        await self._leases.delete_left_behind()
        redo: list[Path] = []
        for path, rec in list(self._records.items()):
            st = state_of(rec.data)
            if st is None or rec.fingerprint is None or not path.exists() or rec.error:
                continue
            if not await self._intact(path, st):
                redo.append(path)
        self._stats["reimports_triggered"] += len(redo)
        return redo

    async def check_records(self, trigger: Callable[[Iterable[Path] | None], None], verified: asyncio.Event) -> None:
        """Wait for containerd, then re-pin or re-import (through ``trigger``) what recorded files produced."""
        backoff, attempt = Backoff(0.5, 30.0), 0
        while True:
            try:
                await self._client().version()
                redo = await self.to_restore()
                if redo:
                    self._log.warning(
                        "Images of %d file(s) are missing or changed in containerd; importing again: %s",
                        len(redo), ", ".join(map(str, redo)),
                    )
                    trigger(redo)
                verified.set()
                return
            except TransientError as exc:
                self._log.warning("Failed to check recorded images (will retry): %s", exc)
                attempt += 1
                await asyncio.sleep(backoff.delay(attempt))

    async def drift_of(self, st: FileImages) -> list[tuple[str, str, str | None]]:
        """How a file's images differ in containerd from what it recorded: (ref, why, namespace), read-only.

        ``why`` is ``unpinned`` when only the pin is missing (put back in place), else the image is gone
        or changed (the file must be handled again).
        """
        client = self._client()
        ns = CRI_NAMESPACE if st.kind == "list" else None
        out: list[tuple[str, str, str | None]] = []
        for name, digest, refs in st.images:
            if st.kind == "list" and (image_id := await client.cri_image_id(name)) != digest:
                out.append((name, "deleted" if image_id is None else f"is {image_id}, not {digest}", ns))
                continue
            for ref in refs:
                img = await client.get_image(ref, namespace=ns)
                if img is None:
                    out.append((ref, "deleted", ns))
                elif st.kind == "tar" and img.target.digest != digest:
                    out.append((ref, f"points at {img.target.digest}, not {digest}", ns))
                elif self._settings.pin and img.labels.get(PIN_LABEL) != "pinned":
                    out.append((ref, "unpinned", ns))
        return out

    async def _intact(self, path: Path, st: FileImages) -> bool:
        """Whether a file's images are all there (missing pins are put back here, as the only repair needed)."""
        intact = True
        for ref, why, ns in await self.drift_of(st):
            if why != "unpinned":
                intact = False
                continue
            await self._client().set_image_labels(
                ref, {PIN_LABEL: "pinned", SOURCE_LABEL: str(path)}, namespace=ns
            )
            self._stats["pins_restored"] += 1
            self._log.info("Restored pin of %s (from %s)", ref, path)
        return intact
