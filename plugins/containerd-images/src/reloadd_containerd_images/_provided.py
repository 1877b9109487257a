"""What each file of the folder provides (image names) and how it went: the consumer's ``reloadd.Providing``.

A ``kube-manifests`` consumer of the same reloadd whose pod waits for an image (``ErrImageNeverPull``)
asks which file provides that name, to say ``image registry.local/web:1.4 is in images/web.tar, import
failed: ...``. Imported files answer from their records (``Ack.data``); a file whose last handling did not
end in an import (failed, refused, waiting) answers from what this module noted then, with the names read
from the archive's own ``index.json``/``manifest.json`` (a failed import left no record of them) or the
list's lines. Reading the names happens once per failure, off the loop; :meth:`Provided.entries` only looks.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reloadd import Ack, PathRecord, Provision, ProvisionState, Reject, Result, Retry

from ._lists import parse_list
from ._oci import ANN_IMAGE_NAME, ANN_REF_NAME, normalize_ref, valid_reference
from ._state import state_of

__all__ = ["Provided", "archive_names"]

_JSON_LIMIT = 4 << 20
_NAMED = ("index.json", "manifest.json")


def archive_names(path: Path) -> tuple[str, ...]:
    """The image names an archive declares (normalised), read from its tar headers and index only.

    Best effort: what was read before an unreadable part (a truncated file) still counts; no names is
    an answer too (a file that is not an archive).
    """
    names: list[str] = []
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                if member.name.lstrip("./") not in _NAMED or not member.isfile() or member.size > _JSON_LIMIT:
                    continue
                f = tar.extractfile(member)
                if f is not None:
                    names.extend(_names_in(member.name.lstrip("./"), json.loads(f.read())))
    except (OSError, tarfile.TarError, ValueError, EOFError):
        pass
    return tuple(dict.fromkeys(names))


def _names_in(what: str, doc: Any) -> Iterator[str]:
    if what == "manifest.json":
        for entry in doc if isinstance(doc, list) else ():
            yield from (normalize_ref(t) for t in (entry or {}).get("RepoTags") or () if valid_reference(t))
        return
    for d in (doc or {}).get("manifests") or () if isinstance(doc, dict) else ():
        ann = (d or {}).get("annotations") or {}
        name = str(ann.get(ANN_IMAGE_NAME) or ann.get(ANN_REF_NAME) or "")
        if name and any(c in name for c in "/.") and valid_reference(name):
            yield normalize_ref(name)


def list_names(path: Path) -> tuple[str, ...]:
    """The references of a ``.txt`` list (normalised); none when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ()
    return tuple(dict.fromkeys(normalize_ref(ref) for _, ref in parse_list(text)[0]))


def names_of(path: Path) -> tuple[str, ...]:
    """What a file of the folder names (blocking: run it off the loop)."""
    return list_names(path) if path.name.lower().endswith(".txt") else archive_names(path)


@dataclass
class _Noted:
    state: ProvisionState
    detail: str
    names: tuple[str, ...]


class Provided:
    """The consumer's answer to ``provisions("image")``.

    Args:
        records: The engine's records of the consumer (imported files, their image names).
        shown: A path as the consumer's messages show it (``images/web.tar``).
        busy: The files being imported or pulled now.
    """

    def __init__(self, records: Mapping[Path, PathRecord], shown: Callable[[Path], str],
                 busy: Mapping[Path, int]) -> None:
        self.records = records
        self.shown = shown
        self.busy = busy
        self._noted: dict[Path, _Noted] = {}

    def outcome(self, path: Path, result: Result | BaseException, names: tuple[str, ...]) -> None:
        """Note how a file's handling ended (``names``: what it declares, read for anything but an Ack)."""
        if isinstance(result, Ack):
            self._noted.pop(path, None)
            return
        verb = "list" if path.name.lower().endswith(".txt") else "import"
        if isinstance(result, Reject) and result.error.startswith("REFUSED"):
            self._noted[path] = _Noted(ProvisionState.REFUSED, f"refused: {result.error}", names)
        elif isinstance(result, Retry) and not result.failure:
            self._noted[path] = _Noted(ProvisionState.PENDING, f"{verb} pending: {result.error}", names)
        elif isinstance(result, (Reject, Retry)):
            self._noted[path] = _Noted(ProvisionState.FAILED, f"{verb} failed: {result.error}", names)
        else:
            self._noted[path] = _Noted(ProvisionState.FAILED, f"{verb} failed: {result}", names)

    def forget(self, path: Path) -> None:
        """The file is gone."""
        self._noted.pop(path, None)

    def entries(self) -> list[Provision]:
        """Every image name a file provides, with its state (a file noted since its last import wins)."""
        out: list[Provision] = []
        for path, rec in self.records.items():
            st = state_of(rec.data)
            if st is None or path in self._noted:
                continue
            state, detail = ProvisionState.DELIVERED, "imported" if st.kind == "tar" else "pulled"
            if rec.error:  # refused since its last import, before this process started (names: that import's)
                state, detail = ProvisionState.FAILED, f"{'import' if st.kind == 'tar' else 'list'} failed: {rec.error}"
            if path in self.busy:
                state, detail = ProvisionState.PENDING, "being handled again"
            out.extend(Provision("image", n, path, state, detail, self.shown(path)) for n, _, _ in st.images)
        for path, noted in self._noted.items():
            state, detail = noted.state, noted.detail
            if path in self.busy:
                state, detail = ProvisionState.PENDING, f"being handled again (last: {detail})"
            out.extend(Provision("image", n, path, state, detail, self.shown(path)) for n in noted.names)
        return out
