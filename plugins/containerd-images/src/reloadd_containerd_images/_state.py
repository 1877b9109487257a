"""Per-file state kept in the engine's records (``Ack.data``), and what it implies.

The data of a file is ``{"kind": "tar"|"list", "images": [{"name", "digest", "refs"}]}``:
every image record the file produced, with its target digest (for a list: the CRI image id).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reloadd import JSONValue

__all__ = ["PIN_LABEL", "SOURCE_LABEL", "FileImages", "state_of"]

PIN_LABEL = "io.cri-containerd.pinned"
"""The label that keeps kubelet's image GC off an image (containerd 1.6.22+/1.7.3+)."""
SOURCE_LABEL = "reloadd.io/source"
"""The file an image record was imported or pulled from."""


@dataclass(frozen=True)
class FileImages:
    """The images one file produced."""

    kind: str
    images: tuple[tuple[str, str, tuple[str, ...]], ...]
    """``(name, digest, refs)`` per image."""

    def to_json(self) -> JSONValue:
        """The Ack data form."""
        return {"kind": self.kind, "images": [{"name": n, "digest": d, "refs": list(r)} for n, d, r in self.images]}

    @property
    def refs(self) -> set[str]:
        """Every image record name of the file."""
        return {r for _, _, refs in self.images for r in refs}


def state_of(data: Any) -> FileImages | None:
    """Parse Ack data back (None when absent or not ours)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("images"), list):
        return None
    out = []
    for img in data["images"]:
        if not isinstance(img, Mapping) or not isinstance(img.get("name"), str):
            continue
        refs = tuple(str(r) for r in img.get("refs") or [img["name"]])
        out.append((str(img["name"]), str(img.get("digest", "")), refs))
    return FileImages(str(data.get("kind", "tar")), tuple(out))
