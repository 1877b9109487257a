"""Apply order: what other objects depend on goes first; deletes run in reverse.

The ranks follow the order package managers settled on (CRDs, then Namespaces, then the objects pods
reference, then RBAC, then everything else). Within a rank the file order is kept (the sort is stable).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["rank", "sort_for_apply", "sort_for_delete"]

T = TypeVar("T")

_RANKS: dict[tuple[str, str], int] = {
    ("apiextensions.k8s.io", "CustomResourceDefinition"): 10,
    ("", "Namespace"): 20,
    ("scheduling.k8s.io", "PriorityClass"): 25,
    ("policy", "PodSecurityPolicy"): 26,
    ("", "ResourceQuota"): 27,
    ("", "LimitRange"): 28,
    ("storage.k8s.io", "StorageClass"): 30,
    ("", "Secret"): 31,
    ("", "ServiceAccount"): 32,
    ("", "PersistentVolume"): 33,
    ("", "PersistentVolumeClaim"): 34,
    ("", "ConfigMap"): 35,
    ("rbac.authorization.k8s.io", "ClusterRole"): 41,
    ("rbac.authorization.k8s.io", "Role"): 42,
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"): 43,
    ("rbac.authorization.k8s.io", "RoleBinding"): 44,
    ("", "Service"): 50,
}
_DEFAULT = 1000


def rank(group: str, kind: str) -> int:
    """The apply rank of a group/kind (lower goes first)."""
    return _RANKS.get((group, kind), _DEFAULT)


def sort_for_apply(items: Iterable[T], key: Callable[[T], tuple[str, str]]) -> list[T]:
    """``items`` ordered for creation; ``key`` gives an item's ``(group, kind)``."""
    return sorted(items, key=lambda it: rank(*key(it)))


def sort_for_delete(items: Iterable[T], key: Callable[[T], tuple[str, str]]) -> list[T]:
    """``items`` ordered for deletion: the reverse of the apply order."""
    return sorted(items, key=lambda it: rank(*key(it)), reverse=True)
