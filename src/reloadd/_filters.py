"""Which paths a consumer is handed: default editor-dropping ignores, globs, roots.

Filters are plain callables ``(Path) -> bool`` so a consumer's own ``accepts`` and the
configured globs compose without a framework.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DEFAULT_IGNORES", "PathFilter", "is_editor_dropping", "is_kubelet_internal", "under"]

DEFAULT_IGNORES: tuple[str, ...] = ("*.swp", "*.swx", "*~", "4913", ".#*", "#*#", "*.tmp")
"""Names of editor droppings ignored by default (vim swap and probe files, emacs locks, temp files).

Names beginning with ``..`` are deliberately *not* here: a ConfigMap mount's ``..data``
swap is exactly the change a user wants to see.
"""

_DEFAULT_RE = re.compile("|".join(fnmatch.translate(p) for p in DEFAULT_IGNORES))


def is_editor_dropping(name: str) -> bool:
    """Whether a file name is an editor dropping (swap, backup, lock or probe file)."""
    return _DEFAULT_RE.match(name) is not None


def is_kubelet_internal(name: str) -> bool:
    """Whether a directory entry is kubelet's atomic-writer bookkeeping (``..data``, ``..2024_…``).

    The user-visible files of a ConfigMap mount are symlinks through ``..data``; the
    timestamped ``..`` directories behind them are never handed over themselves.
    """
    return name.startswith("..")


def under(path: Path | str, root: Path | str) -> bool:
    """Whether ``path`` is ``root`` or lies beneath it (purely lexical, string-prefix fast)."""
    r = str(root)
    p = str(path)
    return p == r or p.startswith(r if r.endswith("/") else r + "/")


@dataclass(frozen=True)
class PathFilter:
    """A consumer's path filter: roots, include/exclude globs and the default ignores.

    Globs match either the path relative to its root or the bare file name, so
    ``"*.yaml"`` and ``"prod/*.yaml"`` both do what one expects.

    Attributes:
        roots: The consumer's roots (files or directories).
        include: When non-empty, only paths matching one of these are accepted.
        exclude: Paths matching any of these are rejected.
        ignore_defaults: Apply :data:`DEFAULT_IGNORES`.
        recursive: Accept paths in sub-directories of a directory root.
    """

    roots: tuple[Path, ...]
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    ignore_defaults: bool = True
    recursive: bool = True
    _table: tuple[tuple[str, str, Path], ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The roots as strings, deepest first (ties in the given order): root_of runs for every new path.
        order = sorted(range(len(self.roots)), key=lambda i: -len(self.roots[i].parts))
        table = tuple((str(self.roots[i]), str(self.roots[i]).rstrip("/") + "/", self.roots[i]) for i in order)
        object.__setattr__(self, "_table", table)

    def root_of(self, path: Path | str) -> Path | None:
        """The (deepest) root ``path`` belongs to, or ``None``."""
        p = path if isinstance(path, str) else str(path)
        for root, prefix, value in self._table:
            if p == root or p.startswith(prefix):
                return value
        return None

    def __call__(self, path: Path) -> bool:
        return self.matches(str(path))

    def matches(self, path: str) -> bool:
        """:meth:`__call__` for a path string (absolute, normalised): no ``Path`` is built."""
        for root, prefix, _ in self._table:
            if path == root:
                return True  # a file root is always wanted
            if path.startswith(prefix):
                break
        else:
            return False
        rel = path[len(root):].lstrip("/")
        if not self.recursive and "/" in rel:
            return False
        if rel.startswith("..") or "/.." in rel:
            return False  # a part of it is kubelet's bookkeeping (see is_kubelet_internal)
        name = rel.rpartition("/")[2]
        if self.ignore_defaults and is_editor_dropping(name):
            return False
        if self.include and not _matches(self.include, rel, name):
            return False
        return not (self.exclude and _matches(self.exclude, rel, name))


def _matches(patterns: Sequence[str], rel: str, name: str) -> bool:
    return any(fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(name, p) for p in patterns)
