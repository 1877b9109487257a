"""Relations between paths and consumers: ``after`` (consumer order) and ``group`` (paths that go together).

``after = ["mirrors"]`` on a consumer makes its batches wait while ``mirrors`` has work
it has seen: paths still settling, queued and not yet failed, or in flight. The graph
must be acyclic and name only existing consumers.

``group = [["tls.crt", "tls.key"], "conf.d/*.conf"]``: each entry (one glob or a list
of globs) is a group; a path belongs to the first group with a glob matching its path
relative to its root, or its file name. Paths of one group that are settling together
are handed over in one batch.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ._errors import ConfigError
from ._suggest import did_you_mean

__all__ = ["GroupOf", "check_after", "group_matcher"]

GroupOf = Callable[[Path], "str | None"]


def check_after(after: Mapping[str, Sequence[str]], where: str = "<config>") -> None:
    """Reject ``after`` names that are unknown, the consumer itself, or form a cycle.

    Raises:
        ConfigError: naming the consumer and the offending name or the cycle.
    """
    for name, deps in after.items():
        for dep in deps:
            if dep == name:
                raise ConfigError(f"{where}: consumer {name!r} lists itself in 'after'")
            if dep not in after:
                known = ", ".join(map(repr, sorted(after))) or "none"
                raise ConfigError(f"{where}: consumer {name!r}: 'after' names unknown consumer {dep!r}"
                                  f"{did_you_mean(dep, after)} (known: {known})")
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            cycle = " -> ".join([*trail[trail.index(name):], name])
            raise ConfigError(f"{where}: 'after' forms a cycle: {cycle}")
        if name in done:
            return
        for dep in after[name]:
            visit(dep, [*trail, name])
        done.add(name)

    for name in sorted(after):
        visit(name, [])


def group_matcher(groups: Sequence[Sequence[str]], roots: Sequence[Path]) -> GroupOf | None:
    """The group of a path (``"0"``, ``"1"``, … by entry) under the given globs, or ``None``."""
    if not groups:
        return None
    tops = sorted((Path(r) for r in roots), key=lambda r: len(r.parts), reverse=True)

    def group_of(path: Path) -> str | None:
        rel = path.name
        for root in tops:
            if path.is_relative_to(root) and path != root:
                rel = path.relative_to(root).as_posix()
                break
        full = str(path)
        for i, globs in enumerate(groups):
            if any(fnmatch.fnmatchcase(rel, g) or fnmatch.fnmatchcase(path.name, g)
                   or (g.startswith("/") and fnmatch.fnmatchcase(full, g)) for g in globs):
                return str(i)
        return None

    return group_of
