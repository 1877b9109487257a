"""Values shared by the parse, merge and render steps.

Everything here is immutable and free of I/O, so the whole pipeline from file bytes
to rendered ``hosts.toml`` text is a pure function that golden tests can pin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from reloadd import PermanentError

__all__ = [
    "AUTH_FILE_HELPER",
    "DEFAULT_SHORT_NAME_MODE",
    "Diagnostic",
    "FileConfig",
    "InputError",
    "MergedConfig",
    "Mirror",
    "Registry",
]

AUTH_FILE_HELPER = "containers-auth.json"
"""The credential helper containers/image uses when the merged list is empty."""

DEFAULT_SHORT_NAME_MODE = "permissive"
"""containers/image's ``defaultShortNameMode``."""


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One finding about one entry of one input file.

    Attributes:
        path: The input file.
        entry: Which entry, e.g. ``[[registry]] #2 (prefix "docker.io")``; empty for the whole file.
        message: What is wrong, in containers/image's words where it has them.
    """

    path: Path
    entry: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}: {self.entry}" if self.entry else str(self.path)
        return f"{where}: {self.message}"


class InputError(PermanentError):
    """An input file is invalid; nothing is applied until it is fixed.

    Attributes:
        diagnostics: Every problem found (at least one), each naming file and entry.
    """

    def __init__(self, diagnostics: list[Diagnostic] | Diagnostic) -> None:
        diags = [diagnostics] if isinstance(diagnostics, Diagnostic) else list(diagnostics)
        super().__init__("; ".join(str(d) for d in diags))
        self.diagnostics = diags

    @classmethod
    def at(cls, path: Path, entry: str, message: str) -> InputError:
        """Shorthand for an error with one diagnostic."""
        return cls(Diagnostic(path, entry, message))


@dataclass(frozen=True, slots=True)
class Mirror:
    """A ``[[registry.mirror]]`` after validation (location trimmed of trailing ``/``)."""

    location: str
    insecure: bool = False
    pull_from_mirror: str = ""


@dataclass(frozen=True, slots=True)
class Registry:
    """A ``[[registry]]`` after validation.

    Attributes:
        prefix: The match prefix (defaults to ``location``).
        location: Where the prefix is rewritten to; empty only for ``*.host`` prefixes.
        insecure: Plain HTTP / unverified TLS for the primary location.
        blocked: Pulls matching the prefix are refused.
        mirror_by_digest_only: Mirrors only for ``@digest`` references.
        mirrors: Mirrors in file order.
        source: The file the entry came from.
        entry: How to name the entry in messages.
    """

    prefix: str
    location: str
    insecure: bool = False
    blocked: bool = False
    mirror_by_digest_only: bool = False
    mirrors: tuple[Mirror, ...] = ()
    source: Path = Path()
    entry: str = ""


@dataclass(frozen=True, slots=True)
class FileConfig:
    """One registries.conf file, parsed and validated on its own.

    ``None`` list values mean "key absent" (keep the earlier value when merging);
    an empty tuple means an explicit ``[]`` (clear it).
    """

    path: Path
    registries: tuple[Registry, ...] = ()
    unqualified_search_registries: tuple[str, ...] | None = None
    credential_helpers: tuple[str, ...] | None = None
    short_name_mode: str = ""
    additional_layer_store_auth_helper: str = ""
    aliases: tuple[tuple[str, str], ...] = ()
    warnings: tuple[Diagnostic, ...] = ()


@dataclass(frozen=True, slots=True)
class MergedConfig:
    """The effective configuration after merging main file and drop-ins.

    Attributes:
        registries: Sorted by prefix, one per prefix (a later file replaced earlier ones whole).
        unqualified_search_registries: The last list set.
        credential_helpers: The last list set, or ``["containers-auth.json"]``.
        short_name_mode: The last mode set, or ``permissive``.
        additional_layer_store_auth_helper: The last helper set.
        aliases: Merged per key; ``""`` deleted a key.
        sources: Every file merged, in merge order.
        warnings: Every file's warnings.
    """

    registries: tuple[Registry, ...] = ()
    unqualified_search_registries: tuple[str, ...] = ()
    credential_helpers: tuple[str, ...] = (AUTH_FILE_HELPER,)
    short_name_mode: str = DEFAULT_SHORT_NAME_MODE
    additional_layer_store_auth_helper: str = ""
    aliases: dict[str, str] = field(default_factory=dict)
    sources: tuple[Path, ...] = ()
    warnings: tuple[Diagnostic, ...] = ()
