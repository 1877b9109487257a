"""What applying or removing one file did: the per-path status reloadd keeps and ``reloadd status`` shows."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._applyset import ObjRef, applyset_id

__all__ = ["FileOutcome", "applyset_of"]

_DOC = re.compile(r"doc (\d+) ")


def applyset_of(data: Mapping[str, Any]) -> str | None:
    """The ApplySet id of a file's record data: its parent's (``None``: the data names no parent).

    Records written by earlier versions keep it as ``applyset``; newer ones leave it out (it is the parent's id).
    """
    old = data.get("applyset")
    if isinstance(old, str) and old:
        return old
    parent = data.get("parent")
    if not isinstance(parent, str) or "/" not in parent:
        return None
    namespace, _, name = parent.partition("/")
    return applyset_id(name, namespace) if namespace and name else None


def _document_order(message: str) -> float:
    """The document a message is about (messages about no document, such as pruning, go last)."""
    match = _DOC.match(message)
    return int(match.group(1)) if match else float("inf")


@dataclass
class FileOutcome:
    """The result of one file.

    Attributes:
        parent: ``namespace/name`` of the ApplySet parent ConfigMap.
        applyset: The ApplySet id.
        sha256: Content hash applied (``""`` for a removal).
        applied: How many objects were applied successfully.
        pruned: Objects deleted (``group/Kind/ns/name``).
        errors: Permanent problems, each naming document, object and cause.
        transient: Problems worth retrying (server overload, a CRD or namespace not there yet).
        pruning_held: Why pruning was skipped, if it was.
        warnings: What the server warned about while applying (deprecated APIs), per object.
        unreadable: How many documents could not be read (they are in ``errors``).
        desired: The objects the file declares (not persisted).
        answers: The server's answer per object applied (not persisted; the drift ledger's baseline).
    """

    parent: str
    applyset: str
    sha256: str = ""
    applied: int = 0
    pruned: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    transient: list[str] = field(default_factory=list)
    pruning_held: str = ""
    warnings: list[str] = field(default_factory=list)
    unreadable: int = 0
    desired: set[ObjRef] = field(default_factory=set)
    answers: dict[ObjRef, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """The objects the file declares plus the documents that could not be read."""
        return len(self.desired) + self.unreadable

    @property
    def partial(self) -> bool:
        """Some of the file's objects were applied and some were not."""
        return 0 < self.applied < self.total

    def problems(self) -> list[str]:
        """Every problem, transient or not, in document order (problems about no document last)."""
        return sorted([*self.transient, *self.errors], key=_document_order)

    def summary(self) -> str:
        """One line for logs and for the engine's error record."""
        parts = self.problems()
        if self.pruning_held:
            parts.append(f"pruning held back: {self.pruning_held}")
        text = "; ".join(parts)
        if self.partial:
            return f"partially applied ({self.applied} of {self.total} objects): {text}"
        return text

    def to_data(self) -> dict[str, Any]:
        """The JSON-able per-path data handed to the engine."""
        # The content's SHA-256 is the record's own digest (and the parent's ``sha256``): kept in the data only
        # beside warnings, to report them once per content across restarts. ~80 bytes a file otherwise.
        # The ApplySet id is the parent's (:func:`applyset_of`): not kept either, ~70 bytes a file.
        data: dict[str, Any] = {
            "parent": self.parent,
            "applied": self.applied,
        }
        if self.pruned:
            data["pruned"] = self.pruned[:100]
        if self.errors or self.transient:
            data["errors"] = self.problems()[:100]
        if self.partial:
            data["partial"] = True
            data["objects"] = self.total
        if self.pruning_held:
            data["pruning_held"] = self.pruning_held
        if self.warnings:
            data["sha256"] = self.sha256
            data["warnings"] = self.warnings[:100]
        return data
