"""Decode one registries.conf file: TOML, key types, unknown keys, v1 versus v2.

containers/image decodes with BurntSushi/toml into fixed structs: a wrong type is a
decode error, an unknown key is silently ignored (logged at debug). reloadd keeps the
errors and turns the silence into a warning that suggests the key meant, because a
typo such as ``mirror_by_digest_only`` otherwise quietly drops a setting.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._model import Diagnostic, InputError

__all__ = ["RawFile", "RawMirror", "RawRegistry", "decode", "registry_entry_name"]

_TOP_KEYS = (
    "registry",
    "unqualified-search-registries",
    "credential-helpers",
    "short-name-mode",
    "additional-layer-store-auth-helper",
    "aliases",
    "registries",
)
_REGISTRY_KEYS = (
    "prefix",
    "location",
    "insecure",
    "blocked",
    "mirror-by-digest-only",
    "mirror",
    "pull-from-mirror",
)
_MIRROR_KEYS = ("location", "insecure", "pull-from-mirror")
_V1_TABLES = ("search", "insecure", "block")


@dataclass(slots=True)
class RawMirror:
    """A mirror as written (not yet trimmed or checked)."""

    location: str = ""
    insecure: bool = False
    pull_from_mirror: str = ""


@dataclass(slots=True)
class RawRegistry:
    """A ``[[registry]]`` as written (not yet trimmed or checked)."""

    entry: str
    prefix: str = ""
    location: str = ""
    insecure: bool = False
    blocked: bool = False
    mirror_by_digest_only: bool = False
    pull_from_mirror: str = ""
    mirrors: list[RawMirror] = field(default_factory=list)


@dataclass(slots=True)
class RawFile:
    """A decoded file: v2 fields, v1 lists, and whether each version set anything."""

    path: Path
    registries: list[RawRegistry] = field(default_factory=list)
    unqualified_search_registries: list[str] | None = None
    credential_helpers: list[str] | None = None
    short_name_mode: str = ""
    additional_layer_store_auth_helper: str = ""
    aliases: dict[str, str] | None = None
    v1_search: list[str] | None = None
    v1_insecure: list[str] | None = None
    v1_block: list[str] | None = None
    warnings: list[Diagnostic] = field(default_factory=list)

    @property
    def has_v1(self) -> bool:
        """Whether a v1 ``[registries.*]`` list is present (containers/image ``hasSetField``)."""
        return any(x is not None for x in (self.v1_search, self.v1_insecure, self.v1_block))

    @property
    def has_v2(self) -> bool:
        """Whether any v2 key is set (containers/image ``hasSetField``)."""
        return bool(
            self.registries
            or self.unqualified_search_registries is not None
            or self.credential_helpers is not None
            or self.short_name_mode
            or self.additional_layer_store_auth_helper
            or self.aliases is not None
        )


def registry_entry_name(index: int, prefix: str, location: str) -> str:
    """How messages name the ``index``-th (1-based) ``[[registry]]`` of a file."""
    if prefix:
        return f'[[registry]] #{index} (prefix "{prefix}")'
    if location:
        return f'[[registry]] #{index} (location "{location}")'
    return f"[[registry]] #{index}"


_TYPE_NAMES = {str: "a string", bool: "a boolean", list: "an array", dict: "a table"}


class _Reader:
    """Collects type errors and unknown-key warnings for one file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.errors: list[Diagnostic] = []
        self.warnings: list[Diagnostic] = []

    def unknown(self, table: Mapping[str, Any], known: tuple[str, ...], entry: str) -> None:
        for key in table:
            if key in known:
                continue
            guess = difflib.get_close_matches(key.replace("_", "-").lower(), known, n=1, cutoff=0.75)
            hint = f" (did you mean {guess[0]!r}?)" if guess else ""
            self.warnings.append(Diagnostic(self.path, entry, f"unknown key {key!r} is ignored{hint}"))

    def get(self, table: Mapping[str, Any], key: str, kind: type, entry: str) -> Any:
        if key not in table:
            return None
        value = table[key]
        if isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool):
            return value
        got = f"{type(value).__name__} {value!r}"
        if len(got) > 80:
            got = got[:77] + "..."
        self.errors.append(Diagnostic(self.path, entry, f"key {key!r} must be {_TYPE_NAMES[kind]}, got {got}"))
        return None

    def str_list(self, table: Mapping[str, Any], key: str, entry: str) -> list[str] | None:
        value = self.get(table, key, list, entry)
        if value is None:
            return None
        bad = [v for v in value if not isinstance(v, str)]
        if bad:
            self.errors.append(Diagnostic(self.path, entry, f"key {key!r} must be an array of strings, got {bad[0]!r}"))
            return None
        return list(value)


def decode(path: Path, data: bytes) -> RawFile:
    """Decode ``data`` (the content of ``path``) into a :class:`RawFile`.

    Raises:
        InputError: invalid UTF-8 or TOML, or keys of the wrong type (all of them listed).
    """
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError.at(path, "", f"not UTF-8 text: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InputError.at(path, "", f"invalid TOML: {exc}") from exc
    except RecursionError as exc:  # tomllib recurses per nesting level: a hostile file must not escape
        raise InputError.at(path, "", "invalid TOML: nested too deeply") from exc
    r = _Reader(path)
    out = RawFile(path)
    r.unknown(doc, _TOP_KEYS, "")
    out.unqualified_search_registries = r.str_list(doc, "unqualified-search-registries", "")
    out.credential_helpers = r.str_list(doc, "credential-helpers", "")
    out.short_name_mode = r.get(doc, "short-name-mode", str, "") or ""
    out.additional_layer_store_auth_helper = r.get(doc, "additional-layer-store-auth-helper", str, "") or ""
    aliases = r.get(doc, "aliases", dict, "")
    if aliases is not None:
        out.aliases = {}
        for name, value in aliases.items():
            if isinstance(value, str):
                out.aliases[name] = value
            else:
                r.errors.append(Diagnostic(path, f"[aliases] {name!r}", f"must be a string, got {value!r}"))
    _decode_v1(r, doc, out)
    registries = r.get(doc, "registry", list, "")
    for i, table in enumerate(registries or (), start=1):
        if not isinstance(table, dict):
            r.errors.append(Diagnostic(path, f"[[registry]] #{i}", "must be a table"))
            continue
        out.registries.append(_decode_registry(r, i, table))
    if r.errors:
        raise InputError(r.errors)
    out.warnings = r.warnings
    return out


def _decode_v1(r: _Reader, doc: Mapping[str, Any], out: RawFile) -> None:
    v1 = r.get(doc, "registries", dict, "")
    if v1 is None:
        return
    r.unknown(v1, _V1_TABLES, "[registries]")
    for name in _V1_TABLES:
        entry = f"[registries.{name}]"
        table = r.get(v1, name, dict, "[registries]")
        if table is None:
            continue
        r.unknown(table, ("registries",), entry)
        setattr(out, f"v1_{name}", r.str_list(table, "registries", entry))


def _decode_registry(r: _Reader, index: int, table: Mapping[str, Any]) -> RawRegistry:
    prefix = table.get("prefix")
    location = table.get("location")
    entry = registry_entry_name(
        index, prefix if isinstance(prefix, str) else "", location if isinstance(location, str) else ""
    )
    r.unknown(table, _REGISTRY_KEYS, entry)
    reg = RawRegistry(entry)
    reg.prefix = r.get(table, "prefix", str, entry) or ""
    reg.location = r.get(table, "location", str, entry) or ""
    reg.insecure = bool(r.get(table, "insecure", bool, entry))
    reg.blocked = bool(r.get(table, "blocked", bool, entry))
    reg.mirror_by_digest_only = bool(r.get(table, "mirror-by-digest-only", bool, entry))
    reg.pull_from_mirror = r.get(table, "pull-from-mirror", str, entry) or ""
    for j, mtable in enumerate(r.get(table, "mirror", list, entry) or (), start=1):
        mentry = f"{entry} mirror #{j}"
        if not isinstance(mtable, dict):
            r.errors.append(Diagnostic(r.path, mentry, "must be a table"))
            continue
        r.unknown(mtable, _MIRROR_KEYS, mentry)
        reg.mirrors.append(
            RawMirror(
                location=r.get(mtable, "location", str, mentry) or "",
                insecure=bool(r.get(mtable, "insecure", bool, mentry)),
                pull_from_mirror=r.get(mtable, "pull-from-mirror", str, mentry) or "",
            )
        )
    return reg
