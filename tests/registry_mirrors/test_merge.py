"""containers/image merge semantics: main file, then drop-ins in lexical order, later wins."""

from __future__ import annotations

from pathlib import Path

from reloadd_registry_mirrors import FileConfig, load_file, merge

D = Path("/etc/containers/registries.conf.d")


def conf(name: str, text: str) -> FileConfig:
    if name == "main":
        return load_file(Path("/etc/containers/registries.conf"), text.encode(), drop_in=False)
    return load_file(D / name, text.encode(), drop_in=True)


def test_later_registry_with_same_prefix_replaces_the_earlier_whole() -> None:
    # containers/image TestRegistriesConfDirectory:
    # base.com insecure=true becomes blocked=true, insecure=false.
    main = conf(
        "main",
        '[[registry]]\nlocation = "base.com"\ninsecure = true\n[[registry.mirror]]\nlocation = "m1.com"\n',
    )
    drop = conf("config-2.conf", '[[registry]]\nlocation = "base.com"\nblocked = true\n')
    (reg,) = merge(main, [drop]).registries
    assert (reg.insecure, reg.blocked, reg.mirrors) == (False, True, ())
    assert reg.source == D / "config-2.conf"


def test_mirrors_are_not_concatenated() -> None:
    a = conf("10-a.conf", '[[registry]]\nlocation = "x.com"\n[[registry.mirror]]\nlocation = "a.com"\n')
    b = conf("20-b.conf", '[[registry]]\nlocation = "x.com"\n[[registry.mirror]]\nlocation = "b.com"\n')
    (reg,) = merge(None, [a, b]).registries
    assert [m.location for m in reg.mirrors] == ["b.com"]


def test_different_prefixes_accumulate_sorted() -> None:
    a = conf("10-a.conf", '[[registry]]\nlocation = "z.com"\n')
    b = conf(
        "20-b.conf",
        '[[registry]]\nlocation = "a.com"\n[[registry]]\nprefix = "z.com/ns"\nlocation = "y.com"\n',
    )
    assert [r.prefix for r in merge(None, [a, b]).registries] == ["a.com", "z.com", "z.com/ns"]


def test_lists_replaced_only_when_present_and_cleared_by_empty_list() -> None:
    main = conf("main", 'unqualified-search-registries = ["a.com"]\ncredential-helpers = ["pass"]\n')
    keep = conf("10-keep.conf", "")
    assert merge(main, [keep]).unqualified_search_registries == ("a.com",)
    replace = conf("20-replace.conf", 'unqualified-search-registries = ["b.com", "c.com"]\n')
    assert merge(main, [keep, replace]).unqualified_search_registries == ("b.com", "c.com")
    clear = conf("30-clear.conf", "unqualified-search-registries = []\ncredential-helpers = []\n")
    merged = merge(main, [keep, replace, clear])
    assert merged.unqualified_search_registries == ()
    # An empty helper list falls back to containers-auth.json, as containers/image does.
    assert merged.credential_helpers == ("containers-auth.json",)
    assert merge(main, [keep]).credential_helpers == ("pass",)


def test_scalar_settings_replaced_when_set() -> None:
    main = conf("main", 'short-name-mode = "enforcing"\nadditional-layer-store-auth-helper = "h1"\n')
    assert merge(main, [conf("10.conf", "")]).short_name_mode == "enforcing"
    later = conf("20.conf", 'short-name-mode = "disabled"\nadditional-layer-store-auth-helper = "h2"\n')
    merged = merge(main, [later])
    assert (merged.short_name_mode, merged.additional_layer_store_auth_helper) == ("disabled", "h2")
    assert merge(None, []).short_name_mode == "permissive"


def test_aliases_merge_per_key_and_empty_string_deletes() -> None:
    main = conf("main", '[aliases]\nfoo = "quay.io/foo"\nbar = "quay.io/bar"\n')
    a = conf("10-a.conf", '[aliases]\nbaz = "quay.io/baz"\nfoo = "docker.io/library/foo"\n')
    b = conf("20-b.conf", '[aliases]\nbar = ""\n')
    assert merge(main, [a, b]).aliases == {"foo": "docker.io/library/foo", "baz": "quay.io/baz"}


def test_sources_and_warnings_follow_merge_order() -> None:
    main = conf("main", "typo = 1\n")
    a = conf("10-a.conf", "other_typo = 2\n")
    merged = merge(main, [a])
    assert merged.sources == (Path("/etc/containers/registries.conf"), D / "10-a.conf")
    assert [w.path for w in merged.warnings] == list(merged.sources)
