"""Every containers/image validation rule, with the file and entry named in the message."""

from __future__ import annotations

from pathlib import Path

import pytest
from reloadd_registry_mirrors import FileConfig, InputError, load_file

from reloadd import PermanentError

DROP_IN = Path("/etc/containers/registries.conf.d/50-test.conf")
MAIN = Path("/etc/containers/registries.conf")


def load(text: str, *, drop_in: bool = True) -> FileConfig:
    return load_file(DROP_IN if drop_in else MAIN, text.encode(), drop_in=drop_in)


def error_of(text: str, *, drop_in: bool = True) -> str:
    with pytest.raises(InputError) as info:
        load(text, drop_in=drop_in)
    return str(info.value)


# (case id, file text, expected fragments of the message: file, entry, upstream wording)
INVALID = [
    (
        "uri-scheme-location",
        '[[registry]]\nlocation = "https://example.com"\n',
        [
            '[[registry]] #1 (location "https://example.com")',
            "invalid location 'https://example.com': URI schemes are not supported",
        ],
    ),
    (
        "uri-scheme-prefix",
        '[[registry]]\nprefix = "http://example.com"\nlocation = "example.com"\n',
        ["invalid location 'http://example.com': URI schemes are not supported"],
    ),
    (
        "uri-scheme-mirror",
        '[[registry]]\nlocation = "a.com"\n[[registry.mirror]]\nlocation = "https://m.com/"\n',
        ['[[registry]] #1 (location "a.com") mirror #1', "invalid location 'https://m.com/'"],
    ),
    (
        "both-unset",
        "[[registry]]\ninsecure = true\n",
        ["[[registry]] #1", "invalid condition: both location and prefix are unset"],
    ),
    (
        "location-unset-not-wildcard",
        '[[registry]]\nprefix = "example.com"\n',
        ["invalid condition: location is unset and prefix is not in the format: *.example.com"],
    ),
    (
        "mirror-location-unset",
        '[[registry]]\nlocation = "a.com"\n[[registry.mirror]]\ninsecure = true\n',
        ["mirror #1", "invalid condition: mirror location is unset"],
    ),
    (
        "pull-from-mirror-on-registry",
        '[[registry]]\nlocation = "a.com"\npull-from-mirror = "digest-only"\n',
        ['pull-from-mirror must not be set for a non-mirror registry "a.com"'],
    ),
    (
        "digest-only-and-pull-from-mirror",
        '[[registry]]\nlocation = "a.com"\nmirror-by-digest-only = true\n'
        '[[registry.mirror]]\nlocation = "m.com"\npull-from-mirror = "all"\n',
        [
            'cannot set mirror usage mirror-by-digest-only for the registry ("a.com") and '
            'pull-from-mirror for per-mirror ("m.com") at the same time'
        ],
    ),
    (
        "unsupported-pull-from-mirror",
        '[[registry]]\nlocation = "a.com"\n[[registry.mirror]]\nlocation = "m.com"\npull-from-mirror = "tags"\n',
        ['unsupported pull-from-mirror value "tags" for mirror "m.com"'],
    ),
    (
        "conflicting-insecure",
        '[[registry]]\nprefix = "a.com/x"\nlocation = "b.com"\ninsecure = true\n'
        '[[registry]]\nprefix = "a.com/y"\nlocation = "b.com"\n',
        [
            '[[registry]] #2 (prefix "a.com/y")',
            "registry 'b.com' is defined multiple times with conflicting 'insecure' setting",
        ],
    ),
    (
        "conflicting-blocked",
        '[[registry]]\nprefix = "a.com/x"\nlocation = "b.com"\nblocked = true\n'
        '[[registry]]\nprefix = "a.com/y"\nlocation = "b.com"\n',
        ["registry 'b.com' is defined multiple times with conflicting 'blocked' setting"],
    ),
    (
        "wildcard-with-path",
        '[[registry]]\nprefix = "*.example.com/foo"\n',
        [
            "Wildcarded prefix should be in the format: *.example.com. "
            'Current prefix "*.example.com/foo" is incorrectly formatted'
        ],
    ),
    (
        "wildcard-with-port",
        '[[registry]]\nprefix = "*.example.com:5000"\nlocation = "x.com"\n',
        ["Wildcarded prefix should be in the format"],
    ),
    (
        "unqualified-search-with-path",
        'unqualified-search-registries = ["docker.io/library"]\n',
        ["unqualified-search-registries", "Invalid unqualified-search-registries entry 'docker.io/library'"],
    ),
    (
        "unqualified-search-scheme",
        'unqualified-search-registries = ["https://quay.io"]\n',
        ["URI schemes are not supported"],
    ),
    (
        "short-name-mode",
        'short-name-mode = "strict"\n',
        ['short-name-mode: invalid short-name mode: "strict"'],
    ),
    (
        "alias-with-registry-name",
        '[aliases]\n"quay.io/foo" = "quay.io/foo/bar"\n',
        ["[aliases] 'quay.io/foo'", 'invalid short name "quay.io/foo": must not contain registry'],
    ),
    (
        "alias-name-with-tag",
        '[aliases]\n"foo:latest" = "quay.io/foo"\n',
        ['invalid short name "foo:latest": must not contain tag'],
    ),
    (
        "alias-name-with-digest",
        '[aliases]\n"foo@sha256:' + "a" * 64 + '" = "quay.io/foo"\n',
        ["must not contain digest"],
    ),
    (
        "alias-name-unparsable",
        '[aliases]\n"Foo" = "quay.io/foo"\n',
        ['cannot parse short name: "Foo": repository name must be lowercase'],
    ),
    (
        "alias-value-not-qualified",
        '[aliases]\nfoo = "foo/bar"\n',
        ['invalid alias "foo/bar": must contain registry and repository'],
    ),
    (
        "alias-value-with-tag",
        '[aliases]\nfoo = "quay.io/foo:1"\n',
        ['invalid alias "quay.io/foo:1": must not contain tag'],
    ),
    (
        "alias-value-unparsable",
        '[aliases]\nfoo = "quay.io/Foo Bar"\n',
        ['parsing alias "quay.io/Foo Bar": invalid reference format'],
    ),
    (
        "v1-drop-in",
        '[registries.search]\nregistries = ["docker.io"]\n',
        ["[registries]: registry must be in v2 format but is in v1"],
    ),
    ("invalid-toml", "[[registry]\nlocation = 1\n", ["invalid TOML"]),
    (
        "wrong-type-bool",
        '[[registry]]\nlocation = "a.com"\ninsecure = "yes"\n',
        ['[[registry]] #1 (location "a.com")', "key 'insecure' must be a boolean, got str 'yes'"],
    ),
    ("wrong-type-list", 'unqualified-search-registries = "docker.io"\n', ["must be an array"]),
    ("wrong-type-list-item", "credential-helpers = [1]\n", ["must be an array of strings, got 1"]),
    ("wrong-type-registry", 'registry = "a.com"\n', ["key 'registry' must be an array"]),
    (
        "wrong-type-mirror",
        '[[registry]]\nlocation = "a.com"\nmirror = ["m.com"]\n',
        ["mirror #1: must be a table"],
    ),
    ("not-utf8", "\udcff", ["not UTF-8"]),
]


@pytest.mark.parametrize(("text", "fragments"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_input_names_file_entry_and_rule(text: str, fragments: list[str]) -> None:
    if text == "\udcff":
        with pytest.raises(InputError) as info:
            load_file(DROP_IN, b"\xff\xfe", drop_in=True)
        message = str(info.value)
    else:
        message = error_of(text)
    assert message.startswith(str(DROP_IN))
    for fragment in fragments:
        assert fragment in message


def test_input_error_is_a_permanent_reloadd_error() -> None:
    with pytest.raises(PermanentError):
        load("[[registry]]\n")


def test_type_errors_are_all_listed() -> None:
    message = error_of('[[registry]]\nlocation = 5\ninsecure = "no"\n[[registry.mirror]]\nlocation = true\n')
    assert "key 'location' must be a string, got int 5" in message
    assert "key 'insecure' must be a boolean" in message
    assert "mirror #1: key 'location' must be a string" in message


def test_mixing_v1_and_v2_in_main_file_is_rejected() -> None:
    message = error_of(
        '[registries.search]\nregistries = ["docker.io"]\n[[registry]]\nlocation = "a.com"\n', drop_in=False
    )
    assert message.startswith(str(MAIN))
    assert "mixing sysregistry v1/v2 is not supported" in message


def test_v1_main_file_is_converted() -> None:
    cfg = load(
        '[registries.search]\nregistries = ["docker.io", "quay.io"]\n'
        '[registries.insecure]\nregistries = ["a.com", "b.com/"]\n'
        '[registries.block]\nregistries = ["b.com"]\n',
        drop_in=False,
    )
    assert cfg.unqualified_search_registries == ("docker.io", "quay.io")
    got = {r.prefix: (r.location, r.insecure, r.blocked) for r in cfg.registries}
    assert got == {"a.com": ("a.com", True, False), "b.com": ("b.com", True, True)}


def test_prefix_defaults_to_location_and_trailing_slashes_are_trimmed() -> None:
    cfg = load('[[registry]]\nlocation = "example.com/foo/"\n[[registry.mirror]]\nlocation = "m.com//"\n')
    (reg,) = cfg.registries
    assert (reg.prefix, reg.location, reg.mirrors[0].location) == (
        "example.com/foo",
        "example.com/foo",
        "m.com",
    )


def test_wildcard_prefix_may_have_empty_location() -> None:
    (reg,) = load('[[registry]]\nprefix = "*.example.com"\nblocked = true\n').registries
    assert (reg.prefix, reg.location, reg.blocked) == ("*.example.com", "", True)


def test_prefix_and_location_may_disagree() -> None:
    # Remapping is the feature; containers/image does not compare them.
    (reg,) = load('[[registry]]\nprefix = "a.com/x"\nlocation = "b.com/y"\n').registries
    assert (reg.prefix, reg.location) == ("a.com/x", "b.com/y")


def test_same_location_with_matching_settings_is_fine() -> None:
    cfg = load(
        '[[registry]]\nprefix = "a.com/x"\nlocation = "b.com"\ninsecure = true\n'
        '[[registry]]\nprefix = "a.com/y"\nlocation = "b.com"\ninsecure = true\n'
    )
    assert [r.prefix for r in cfg.registries] == ["a.com/x", "a.com/y"]


def test_duplicate_prefix_in_one_file_keeps_first_and_warns() -> None:
    cfg = load(
        '[[registry]]\nprefix = "a.com"\nlocation = "first.com"\n'
        '[[registry]]\nprefix = "a.com"\nlocation = "second.com"\n'
    )
    assert [r.location for r in cfg.registries] == ["first.com"]
    (warning,) = cfg.warnings
    assert warning.entry == '[[registry]] #2 (prefix "a.com")'
    assert "duplicate prefix" in warning.message


def test_registries_are_sorted_by_prefix() -> None:
    cfg = load('[[registry]]\nlocation = "z.com"\n[[registry]]\nlocation = "a.com"\n')
    assert [r.prefix for r in cfg.registries] == ["a.com", "z.com"]


@pytest.mark.parametrize(
    ("text", "entry", "hint"),
    [
        (
            '[[registry]]\nlocation = "a.com"\nmirror_by_digest_only = true\n',
            "[[registry]] #1",
            "mirror-by-digest-only",
        ),
        (
            '[[registry]]\nlocation = "a.com"\n[[registry.mirror]]\nlocation = "m"\npull_from_mirror = "all"\n',
            "mirror #1",
            "pull-from-mirror",
        ),
        ('unqualified_search_registries = ["docker.io"]\n', "", "unqualified-search-registries"),
        ('[[registry]]\nlocation = "a.com"\nmirrors = []\n', "[[registry]] #1", "mirror"),
        ("colour = 1\n", "", None),
    ],
    ids=["registry-key", "mirror-key", "top-level-key", "plural", "no-suggestion"],
)
def test_unknown_keys_are_warned_with_a_suggestion(text: str, entry: str, hint: str | None) -> None:
    cfg = load(text)
    (warning,) = cfg.warnings
    assert warning.path == DROP_IN
    assert entry in warning.entry
    assert "is ignored" in warning.message
    if hint:
        assert f"did you mean {hint!r}" in warning.message
    else:
        assert "did you mean" not in warning.message


def test_valid_aliases_and_deletion_marker() -> None:
    cfg = load('[aliases]\nfoo = "quay.io/foo/bar"\nbar = ""\n"org/baz" = "localhost/baz"\n')
    assert dict(cfg.aliases) == {"foo": "quay.io/foo/bar", "bar": "", "org/baz": "localhost/baz"}


def test_alias_errors_are_all_reported_together() -> None:
    message = error_of('[aliases]\n"a.com/x" = "y"\nfoo = "bar"\n')
    assert "must not contain registry" in message
    assert 'invalid alias "y"' in message
    assert 'invalid alias "bar"' in message
