"""What applying or removing one file did: the per-path status reloadd keeps and ``reloadd status`` shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._applyset import ObjRef

__all__ = ["FileOutcome"]


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
        desired: The objects the file declares (not persisted).
    """

    parent: str
    applyset: str
    sha256: str = ""
    applied: int = 0
    pruned: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    transient: list[str] = field(default_factory=list)
    pruning_held: str = ""
    desired: set[ObjRef] = field(default_factory=set)

    def summary(self) -> str:
        """One line for logs and for the engine's error record."""
        parts = [*self.transient, *self.errors]
        if self.pruning_held:
            parts.append(f"pruning held back: {self.pruning_held}")
        return "; ".join(parts)

    def to_data(self) -> dict[str, Any]:
        """The JSON-able per-path data handed to the engine."""
        data: dict[str, Any] = {
            "parent": self.parent,
            "applyset": self.applyset,
            "sha256": self.sha256,
            "applied": self.applied,
        }
        if self.pruned:
            data["pruned"] = self.pruned[:100]
        if self.errors or self.transient:
            data["errors"] = [*self.transient, *self.errors][:100]
        if self.pruning_held:
            data["pruning_held"] = self.pruning_held
        return data
