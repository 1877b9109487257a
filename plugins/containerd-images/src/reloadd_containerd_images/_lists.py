"""``.txt`` image lists: one reference a line, pre-pulled through CRI so containerd's registry
configuration (mirrors, auth from the mirror-reloader plugin) applies.

Like k3s's pre-pull loop: CRI ImageStatus first, PullImage only when absent. One failing
reference does not stop the others.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiofiles

from reloadd import ConsumerError, TransientError

from ._client import CRI_NAMESPACE, ContainerdClient
from ._oci import normalize_ref, valid_reference

__all__ = ["ListResult", "parse_list", "pull_list"]

LIST_LIMIT = 1 << 20
"""Largest ``.txt`` list accepted, in bytes."""


@dataclass
class ListResult:
    """Outcome of one list."""

    images: list[dict[str, object]] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    pulled: int = 0


def parse_list(text: str) -> tuple[list[tuple[int, str]], list[str]]:
    """Split a list into ``(line number, reference)`` pairs and error messages.

    Blank lines and ``#`` comments (whole-line or trailing) are skipped.
    """
    refs: list[tuple[int, str]] = []
    errors: list[str] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not valid_reference(line):
            shown = line if len(line) <= 80 else line[:77] + "..."
            errors.append(f"line {n}: {shown!r} is not a valid image reference")
            continue
        refs.append((n, line))
    return refs, errors


async def read_list(path: Path) -> str:
    """Read a list file as UTF-8 text (bounded), through aiofiles."""
    async with aiofiles.open(path, "rb") as f:
        # What the file holds, plus one byte to see it grew: not LIST_LIMIT + 1 allocated per read.
        want = min(os.fstat(f.fileno()).st_size, LIST_LIMIT) + 1
        raw = await f.read(want)
        if len(raw) == want <= LIST_LIMIT:  # it grew since the fstat: read on, up to the limit
            raw += await f.read(LIST_LIMIT + 1 - want)
    if len(raw) > LIST_LIMIT:
        raise ValueError(f"list is larger than {LIST_LIMIT} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"list is not UTF-8 text: {exc}") from exc


async def pull_list(
    client: ContainerdClient, text: str, labels: Mapping[str, str], timeout: float, log: logging.Logger, path: Path
) -> ListResult:
    """Make every listed image present; label (pin) each one."""
    res = ListResult()
    refs, res.invalid = parse_list(text)
    for n, ref in refs:
        name = normalize_ref(ref)
        try:
            image_id = await client.cri_image_id(name)
            if image_id is None:
                image_id = await client.cri_pull(name, timeout)
                res.pulled += 1
                log.info("Pulled image %s (%s) listed in %s", name, image_id, path)
            refs_made = [name]
            if labels:
                await client.set_image_labels(name, dict(labels), namespace=CRI_NAMESPACE)
            res.images.append({"name": name, "digest": image_id, "refs": refs_made})
        except ConsumerError as exc:
            kind = "unavailable" if isinstance(exc, TransientError) else "failed"
            res.failed.append(f"line {n}: {ref}: {kind}: {exc}")
            log.warning("Failed to pull %s listed in %s: %s", name, path, exc)
    return res
