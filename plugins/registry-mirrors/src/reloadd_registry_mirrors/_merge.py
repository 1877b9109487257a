"""Merge the main file and drop-ins as containers/image's ``updateWithConfigurationFrom`` does."""

from __future__ import annotations

from collections.abc import Sequence

from ._model import AUTH_FILE_HELPER, DEFAULT_SHORT_NAME_MODE, Diagnostic, FileConfig, MergedConfig, Registry

__all__ = ["merge"]


def merge(main: FileConfig | None, drop_ins: Sequence[FileConfig]) -> MergedConfig:
    """Merge ``main`` then each drop-in (already in lexical order), later files winning.

    * ``[[registry]]`` entries are keyed by prefix; a later entry replaces an earlier one
      whole (no field merge, mirrors not concatenated). The result is sorted by prefix.
    * ``unqualified-search-registries`` and ``credential-helpers`` are replaced only when
      the key is present; an explicit ``[]`` clears them.
    * ``short-name-mode`` and ``additional-layer-store-auth-helper`` are replaced when non-empty.
    * Aliases merge per key; ``""`` erases a key set by an earlier file.
    * Defaults last: no credential helper means ``containers-auth.json``, no mode means permissive.
    """
    registries: dict[str, Registry] = {}
    unqualified: tuple[str, ...] = ()
    helpers: tuple[str, ...] = ()
    mode = ""
    als_helper = ""
    aliases: dict[str, str] = {}
    warnings: list[Diagnostic] = []
    files = ([main] if main is not None else []) + list(drop_ins)
    for f in files:
        for reg in f.registries:
            registries[reg.prefix] = reg
        if f.unqualified_search_registries is not None:
            unqualified = f.unqualified_search_registries
        if f.credential_helpers is not None:
            helpers = f.credential_helpers
        mode = f.short_name_mode or mode
        als_helper = f.additional_layer_store_auth_helper or als_helper
        aliases.update(f.aliases)
        warnings.extend(f.warnings)
    return MergedConfig(
        registries=tuple(registries[p] for p in sorted(registries)),
        unqualified_search_registries=unqualified,
        credential_helpers=helpers or (AUTH_FILE_HELPER,),
        short_name_mode=mode or DEFAULT_SHORT_NAME_MODE,
        additional_layer_store_auth_helper=als_helper,
        aliases={k: v for k, v in aliases.items() if v != ""},
        sources=tuple(f.path for f in files),
        warnings=tuple(warnings),
    )
