"""ApplySet (KEP-3659) bookkeeping: one parent ConfigMap per manifest file.

The parent is spec-compliant, so ``kubectl apply --applyset`` and other tools can read the sets:

* label ``applyset.kubernetes.io/id = applyset-<base64url(sha256("<name>.<ns>.ConfigMap."))>-v1``;
* annotations ``applyset.kubernetes.io/tooling``, ``contains-group-kinds`` (sorted ``Kind.group``)
  and ``additional-namespaces`` (sorted, without the parent's own namespace);
* every member carries ``applyset.kubernetes.io/part-of = <id>``.

reloadd adds ``data``: the source path, the content SHA-256 and an inventory (``group/Kind/ns/name`` per
line), which tells a human what a file made. The labels stay the source of truth for pruning.

The parent's name hashes the file's path (relative to its root, with the consumer name), so files that
share a basename never collide and any file name yields a valid object name.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ANN_GROUP_KINDS",
    "ANN_NAMESPACES",
    "ANN_TOOLING",
    "LABEL_ID",
    "LABEL_MANAGED_BY",
    "LABEL_PART_OF",
    "ObjRef",
    "ParentState",
    "applyset_id",
    "parent_body",
    "parent_name",
    "read_parent",
]

LABEL_ID = "applyset.kubernetes.io/id"
LABEL_PART_OF = "applyset.kubernetes.io/part-of"
ANN_TOOLING = "applyset.kubernetes.io/tooling"
ANN_GROUP_KINDS = "applyset.kubernetes.io/contains-group-kinds"
ANN_NAMESPACES = "applyset.kubernetes.io/additional-namespaces"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"


def applyset_id(name: str, namespace: str, kind: str = "ConfigMap", group: str = "") -> str:
    """The spec's id of the ApplySet whose parent is ``kind.group`` ``namespace/name``."""
    digest = hashlib.sha256(f"{name}.{namespace}.{kind}.{group}".encode()).digest()
    return "applyset-" + base64.urlsafe_b64encode(digest).decode().rstrip("=") + "-v1"


def parent_name(source_key: str) -> str:
    """``reloadd-<slug of the basename>-<10 hex of sha256(source_key)>``, a valid DNS-1123 name."""
    base = re.split(r"[/:]", source_key)[-1].lower()
    slug = re.sub(r"[^a-z0-9]+", "-", base).strip("-")[:40].strip("-") or "manifest"
    return f"reloadd-{slug}-{hashlib.sha256(source_key.encode()).hexdigest()[:10]}"


@dataclass(frozen=True, slots=True, order=True)
class ObjRef:
    """The identity of an object: group, kind, namespace (``""`` if cluster-scoped), name."""

    group: str
    kind: str
    namespace: str
    name: str

    @property
    def group_kind(self) -> str:
        """``Kind.group`` (``Kind`` for core)."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def __str__(self) -> str:
        return f"{self.group}/{self.kind}/{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, text: str) -> ObjRef:
        """Inverse of ``str()``."""
        group, kind, namespace, name = text.split("/", 3)
        return cls(group, kind, namespace, name)


@dataclass
class ParentState:
    """What a parent ConfigMap records.

    Attributes:
        exists: Whether the parent was found.
        group_kinds: ``Kind.group`` strings from the annotation.
        namespaces: Namespaces that may hold members. reloadd records them exactly in ``data``; a parent
            written by another tool falls back to the spec's annotation plus the parent's namespace.
        sha256: Content hash of the file last applied.
        source: The file path.
        inventory: Members recorded last time.
    """

    exists: bool = False
    group_kinds: set[str] = field(default_factory=set)
    namespaces: set[str] = field(default_factory=set)
    sha256: str = ""
    source: str = ""
    inventory: set[ObjRef] = field(default_factory=set)


def _split_list(value: Any) -> set[str]:
    return {s for s in str(value or "").split(",") if s}


def read_parent(obj: Mapping[str, Any] | None, own_namespace: str) -> ParentState:
    """Decode a parent ConfigMap (``None`` when it does not exist)."""
    if not obj:
        return ParentState()
    meta = obj.get("metadata") or {}
    ann = meta.get("annotations") or {}
    data = obj.get("data") or {}
    inventory = set()
    for line in str(data.get("inventory") or "").splitlines():
        try:
            inventory.add(ObjRef.parse(line))
        except ValueError:
            continue
    return ParentState(
        exists=True,
        group_kinds=_split_list(ann.get(ANN_GROUP_KINDS)),
        namespaces=(
            _split_list(data["namespaces"]) if "namespaces" in data
            else _split_list(ann.get(ANN_NAMESPACES)) | {own_namespace}
        ),
        sha256=str(data.get("sha256") or ""),
        source=str(data.get("source") or ""),
        inventory=inventory,
    )


def parent_body(
    name: str,
    namespace: str,
    *,
    tooling: str,
    group_kinds: Iterable[str],
    namespaces: Iterable[str],
    source: str,
    sha256: str,
    inventory: Iterable[ObjRef],
    key: str = "",
) -> dict[str, Any]:
    """The apply body of a parent ConfigMap (``key``: the file's ApplySet key, ``<consumer>:<relative path>``)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_ID: applyset_id(name, namespace), LABEL_MANAGED_BY: "reloadd"},
            "annotations": {
                ANN_TOOLING: tooling,
                ANN_GROUP_KINDS: ",".join(sorted(set(group_kinds))),
                ANN_NAMESPACES: ",".join(sorted(set(namespaces) - {namespace})),
            },
        },
        "data": {
            "source": source,
            "sha256": sha256,
            "namespaces": ",".join(sorted(set(namespaces))),
            "inventory": "".join(f"{ref}\n" for ref in sorted(set(inventory))),
            **({"key": key} if key else {}),
        },
    }
