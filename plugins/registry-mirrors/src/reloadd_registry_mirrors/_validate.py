"""containers/image's per-file validation (``loadConfigFile`` + ``postProcessRegistries``).

Every rule of containers/image is kept, in its order and with its wording, each
message prefixed with the file and entry it is about. Each file is validated on its
own, before merging, exactly as upstream does: one bad file fails the whole load.
"""

from __future__ import annotations

import re
from pathlib import Path

from ._model import Diagnostic, FileConfig, InputError, Mirror, Registry
from ._parse import RawFile, RawRegistry, decode, registry_entry_name
from ._reference import DOMAIN, ReferenceError, parse_reference

__all__ = ["PULL_FROM_MIRROR_VALUES", "SHORT_NAME_MODES", "load_file", "validate"]

SHORT_NAME_MODES = ("disabled", "enforcing", "permissive")
PULL_FROM_MIRROR_VALUES = ("all", "digest-only", "tag-only")
_ANCHORED_DOMAIN = re.compile(DOMAIN)


def load_file(path: Path, data: bytes, *, drop_in: bool) -> FileConfig:
    """Decode and validate one registries.conf file.

    Args:
        path: The file (for messages).
        data: Its content.
        drop_in: True for files of registries.conf.d, which must be v2.

    Raises:
        InputError: naming the file and entry, in containers/image's words.
    """
    return validate(decode(path, data), drop_in=drop_in)


def _parse_location(raw: str, path: Path, entry: str) -> str:
    trimmed = raw.rstrip("/")
    if trimmed.startswith(("http://", "https://")):
        raise InputError.at(path, entry, f"invalid location '{raw}': URI schemes are not supported")
    return trimmed


def validate(raw: RawFile, *, drop_in: bool) -> FileConfig:
    """Apply containers/image's rules to a decoded file.

    Raises:
        InputError: on the first rule broken (aliases: all of them).
    """
    path = raw.path
    if raw.has_v1:
        if drop_in:
            raise InputError.at(path, "[registries]", "registry must be in v2 format but is in v1")
        if raw.has_v2:
            raise InputError.at(
                path,
                "[registries]",
                "mixing sysregistry v1/v2 is not supported: v1 [registries.search|insecure|block] "
                "tables next to v2 keys",
            )
        _convert_v1(raw)
    warnings = list(raw.warnings)
    registries = _post_process_registries(raw, warnings)
    unqualified = None
    if raw.unqualified_search_registries is not None:
        unqualified = []
        for value in raw.unqualified_search_registries:
            host = _parse_location(value, path, "unqualified-search-registries")
            if not _ANCHORED_DOMAIN.fullmatch(host):
                raise InputError.at(
                    path,
                    "unqualified-search-registries",
                    f"Invalid unqualified-search-registries entry {host!r}",
                )
            unqualified.append(host)
    if raw.short_name_mode and raw.short_name_mode not in SHORT_NAME_MODES:
        raise InputError.at(path, "short-name-mode", f'invalid short-name mode: "{raw.short_name_mode}"')
    for reg in registries:
        if reg.prefix.startswith("*.") and any(c in reg.prefix for c in "/@:"):
            raise InputError.at(
                path,
                reg.entry,
                "Wildcarded prefix should be in the format: *.example.com. "
                f'Current prefix "{reg.prefix}" is incorrectly formatted',
            )
    aliases = _validate_aliases(path, raw.aliases or {})
    return FileConfig(
        path=path,
        registries=tuple(registries),
        unqualified_search_registries=None if unqualified is None else tuple(unqualified),
        credential_helpers=None if raw.credential_helpers is None else tuple(raw.credential_helpers),
        short_name_mode=raw.short_name_mode,
        additional_layer_store_auth_helper=raw.additional_layer_store_auth_helper,
        aliases=tuple(aliases.items()),
        warnings=tuple(warnings),
    )


def _convert_v1(raw: RawFile) -> None:
    """``ConvertToV2``: one registry per location, blocked first, then insecure."""
    by_location: dict[str, RawRegistry] = {}
    for kind, values in (("block", raw.v1_block), ("insecure", raw.v1_insecure)):
        for value in values or ():
            location = _parse_location(value, raw.path, f"[registries.{kind}]")
            reg = by_location.get(location)
            if reg is None:
                reg = RawRegistry(registry_entry_name(len(by_location) + 1, location, location))
                reg.prefix = reg.location = location
                by_location[location] = reg
            if kind == "block":
                reg.blocked = True
            else:
                reg.insecure = True
    raw.registries = list(by_location.values())
    raw.unqualified_search_registries = raw.v1_search


def _post_process_registries(raw: RawFile, warnings: list[Diagnostic]) -> list[Registry]:
    """``postProcessRegistries``: each entry checked, then the entries checked against each other."""
    checked = [_registry(reg, raw.path) for reg in raw.registries]
    _check_conflicts(checked, raw.path)
    return _first_per_prefix(checked, raw.path, warnings)


def _registry(reg: RawRegistry, path: Path) -> Registry:
    """One ``[[registry]]`` entry: its prefix (the location when unset) and its mirrors checked."""
    entry = reg.entry
    location = _parse_location(reg.location, path, entry)
    if reg.prefix == "":
        if location == "":
            raise InputError.at(path, entry, "invalid condition: both location and prefix are unset")
        prefix = location
    else:
        prefix = _parse_location(reg.prefix, path, entry)
        if not prefix.startswith("*.") and location == "":
            raise InputError.at(
                path,
                entry,
                "invalid condition: location is unset and prefix is not in the format: *.example.com",
            )
    if reg.pull_from_mirror:
        raise InputError.at(path, entry, f'pull-from-mirror must not be set for a non-mirror registry "{prefix}"')
    return Registry(
        prefix=prefix,
        location=location,
        insecure=reg.insecure,
        blocked=reg.blocked,
        mirror_by_digest_only=reg.mirror_by_digest_only,
        mirrors=tuple(_mirrors(reg, prefix, path)),
        source=path,
        entry=entry,
    )


def _mirrors(reg: RawRegistry, prefix: str, path: Path) -> list[Mirror]:
    """A registry's ``[[registry.mirror]]`` entries: a location each, ``pull-from-mirror`` consistent."""
    mirrors = []
    for j, raw_mirror in enumerate(reg.mirrors, start=1):
        mentry = f"{reg.entry} mirror #{j}"
        mlocation = _parse_location(raw_mirror.location, path, mentry)
        if mlocation == "":
            raise InputError.at(path, mentry, "invalid condition: mirror location is unset")
        pfm = raw_mirror.pull_from_mirror
        if reg.mirror_by_digest_only and pfm:
            raise InputError.at(
                path,
                mentry,
                f'cannot set mirror usage mirror-by-digest-only for the registry ("{prefix}") '
                f'and pull-from-mirror for per-mirror ("{mlocation}") at the same time',
            )
        if pfm and pfm not in PULL_FROM_MIRROR_VALUES:
            raise InputError.at(
                path, mentry, f'unsupported pull-from-mirror value "{pfm}" for mirror "{mlocation}"'
            )
        mirrors.append(Mirror(mlocation, raw_mirror.insecure, pfm))
    return mirrors


def _check_conflicts(checked: list[Registry], path: Path) -> None:
    """Entries for the same location (or wildcard prefix) must agree on insecure and blocked."""
    groups: dict[str, list[Registry]] = {}
    for done in checked:
        groups.setdefault(done.location or done.prefix, []).append(done)
    for done in checked:
        for other in groups[done.location or done.prefix]:
            for attr in ("insecure", "blocked"):
                if getattr(done, attr) != getattr(other, attr):
                    raise InputError.at(
                        path,
                        other.entry,
                        f"registry '{done.location}' is defined multiple times with conflicting '{attr}' setting",
                    )


def _first_per_prefix(checked: list[Registry], path: Path, warnings: list[Diagnostic]) -> list[Registry]:
    """Within one file the first entry for a prefix wins; upstream drops the rest silently (we warn)."""
    unique: dict[str, Registry] = {}
    for done in checked:
        if done.prefix in unique:
            warnings.append(
                Diagnostic(
                    path,
                    done.entry,
                    f'duplicate prefix "{done.prefix}" is ignored: {unique[done.prefix].entry} wins',
                )
            )
            continue
        unique[done.prefix] = done
    return [unique[p] for p in sorted(unique)]


def _validate_aliases(path: Path, aliases: dict[str, str]) -> dict[str, str]:
    errors: list[Diagnostic] = []
    for name, value in aliases.items():
        entry = f"[aliases] {name!r}"
        problem = _short_name_problem(name)
        if problem:
            errors.append(Diagnostic(path, entry, problem))
        if value == "":
            continue
        problem = _alias_value_problem(value)
        if problem:
            errors.append(Diagnostic(path, entry, problem))
    if errors:
        raise InputError(errors)
    return dict(aliases)


def _short_name_problem(name: str) -> str | None:
    try:
        ref = parse_reference(name)
    except ReferenceError as exc:
        return f'cannot parse short name: "{name}": {exc}'
    if ref.digest:
        return f'invalid short name "{name}": must not contain digest'
    if ref.tag:
        return f'invalid short name "{name}": must not contain tag'
    if any(c in ref.domain for c in ".:") or ref.domain == "localhost":
        return f'invalid short name "{name}": must not contain registry'
    return None


def _alias_value_problem(value: str) -> str | None:
    try:
        ref = parse_reference(value)
    except ReferenceError as exc:
        return f'parsing alias "{value}": {exc}'
    if ref.digest:
        return f'invalid alias "{value}": must not contain digest'
    if ref.tag:
        return f'invalid alias "{value}": must not contain tag'
    if not (any(c in ref.domain for c in ".:") or ref.domain == "localhost"):
        return f'invalid alias "{value}": must contain registry and repository'
    return None
