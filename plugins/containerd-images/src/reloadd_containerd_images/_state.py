"""Per-file state kept in the engine's records (``Ack.data``), and what it implies.

The data of a file is ``{"kind": "tar"|"list", "images": [{"name", "digest", "refs"}]}``:
every image record the file produced, with its target digest (for a list: the CRI image id).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reloadd import JSONValue, PathRecord

__all__ = ["FileImages", "refs_held_elsewhere", "state_of"]


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


def refs_held_elsewhere(records: Mapping[Path, PathRecord], but: Path, extra: Iterable[FileImages] = ()) -> set[str]:
    """Image record names produced by any file other than ``but``."""
    held: set[str] = set()
    for p, rec in records.items():
        if p == but:
            continue
        st = state_of(rec.data)
        if st is not None:
            held |= st.refs
    for st in extra:
        held |= st.refs
    return held
