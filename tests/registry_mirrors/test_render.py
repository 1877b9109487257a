"""Golden tests of the renderer: one case per row of the registries.conf → hosts.toml mapping.

Each golden file under ``golden/`` holds every rendered ``<dir>/hosts.toml`` and the warnings.
Regenerate after an intended change with ``REGEN_GOLDENS=1 pytest tests/registry_mirrors/test_render.py``
and review the diff.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest
from reloadd_registry_mirrors import HEADER, CertFiles, InputError, _render, load_file, load_yaml, merge, render

GOLDEN = Path(__file__).parent / "golden"
D = Path("/etc/containers/registries.conf.d")
YAML = Path("/etc/rancher/k3s/registries.yaml")

CASES: dict[str, dict[str, str]] = {
    # Mirror order kept, primary last as server; docker.io's server is registry-1.docker.io.
    "mirrors-in-order": {
        "50-dockerhub.conf": """
[[registry]]
prefix = "docker.io"
location = "docker.io"
[[registry.mirror]]
location = "mirror-a.example.com"
[[registry.mirror]]
location = "mirror-b.example.com:5000"
""",
    },
    # host:port directory name, server on the same port.
    "host-with-port": {
        "50-private.conf": """
[[registry]]
location = "registry.example.com:5000"
[[registry.mirror]]
location = "cache.example.com"
""",
    },
    # Namespace path on a mirror: /v2/<ns> plus override_path.
    "mirror-namespace-path": {
        "50-ns.conf": """
[[registry]]
location = "quay.io"
[[registry.mirror]]
location = "cache.example.com/quay-proxy/"
""",
    },
    # insecure mirror: http:// plus skip_verify (HTTPS without verification, then HTTP).
    "mirror-insecure": {
        "50-insecure.conf": """
[[registry]]
location = "ghcr.io"
[[registry.mirror]]
location = "10.0.0.5:5000"
insecure = true
""",
    },
    # insecure primary: server over http:// with skip_verify; the mirror stays https.
    "registry-insecure": {
        "50-insecure.conf": """
[[registry]]
location = "registry.local:5000"
insecure = true
[[registry.mirror]]
location = "mirror.local"
""",
    },
    # pull-from-mirror all/default → pull+resolve; digest-only → pull only.
    "pull-from-mirror": {
        "50-pfm.conf": """
[[registry]]
location = "registry.k8s.io"
[[registry.mirror]]
location = "all.example.com"
pull-from-mirror = "all"
[[registry.mirror]]
location = "digest.example.com"
pull-from-mirror = "digest-only"
[[registry.mirror]]
location = "default.example.com"
""",
    },
    # mirror-by-digest-only on the registry: every mirror pull only.
    "mirror-by-digest-only": {
        "50-digest.conf": """
[[registry]]
location = "docker.io"
mirror-by-digest-only = true
[[registry.mirror]]
location = "m1.example.com"
[[registry.mirror]]
location = "m2.example.com"
""",
    },
    # tag-only cannot be expressed: that mirror is skipped, the others stay.
    "pull-from-mirror-tag-only": {
        "50-tag.conf": """
[[registry]]
location = "docker.io"
[[registry.mirror]]
location = "tags.example.com"
pull-from-mirror = "tag-only"
[[registry.mirror]]
location = "all.example.com"
""",
    },
    # Location remap of the primary (bare-host prefix): server points at the new location.
    "location-remap": {
        "50-remap.conf": """
[[registry]]
prefix = "registry.example.com"
location = "internal.example.com:8443/team"
[[registry.mirror]]
location = "cache.example.com"
""",
    },
    # Not expressible: prefix with a path, a wildcard, blocked; all skipped with warnings, nothing widened.
    "not-expressible": {
        "50-path.conf": """
[[registry]]
prefix = "docker.io/library"
location = "docker.io/library"
[[registry.mirror]]
location = "library-mirror.example.com"
[[registry]]
prefix = "*.example.com"
[[registry.mirror]]
location = "wild.example.org"
[[registry]]
location = "blocked.example.com"
blocked = true
[[registry.mirror]]
location = "m.example.com"
""",
    },
    # No mirrors: nothing rendered; insecure/location that would be lost are warned about.
    "no-mirrors": {
        "50-plain.conf": """
unqualified-search-registries = ["docker.io", "quay.io"]
short-name-mode = "enforcing"
credential-helpers = ["pass"]
[aliases]
busybox = "docker.io/library/busybox"
[[registry]]
location = "quay.io"
[[registry]]
location = "insecure.example.com"
insecure = true
""",
    },
    # containers-certs.d CA and client files listed explicitly for server and mirrors.
    "certs": {
        "50-certs.conf": """
[[registry]]
location = "secure.example.com"
[[registry.mirror]]
location = "mirror.example.com:5000"
""",
    },
    # Merge: a later drop-in replaces the entry whole; the main file's other hosts stay.
    "merged-drop-ins": {
        "main": """
[[registry]]
location = "docker.io"
[[registry.mirror]]
location = "old.example.com"
[[registry]]
location = "quay.io"
[[registry.mirror]]
location = "quay-cache.example.com"
""",
        "90-override.conf": """
[[registry]]
location = "docker.io"
[[registry.mirror]]
location = "new.example.com"
""",
    },
    # registries.yaml (k3s): endpoints, TLS configs, "*" → _default, rewrite skipped, auth ignored.
    "registries-yaml": {
        "50-dockerhub.conf": """
[[registry]]
location = "docker.io"
[[registry.mirror]]
location = "from-conf.example.com"
""",
        "registries.yaml": """
mirrors:
  docker.io:
    endpoint:
      - "https://yaml-mirror.example.com:5000"
      - "http://10.0.0.9:5000/v2"
      - "https://registry-1.docker.io"
  "*":
    endpoint:
      - "mirror.example.net/prefix/v2"
  gcr.io:
    endpoint: ["https://gcr-mirror.example.com"]
    rewrite:
      "^(.*)": "gcr/$1"
configs:
  "yaml-mirror.example.com:5000":
    tls:
      ca_file: /etc/ssl/mirror-ca.pem
      cert_file: /etc/ssl/client.pem
      key_file: /etc/ssl/client-key.pem
  "10.0.0.9:5000":
    tls:
      insecure_skip_verify: true
    auth:
      username: u
      password: p
""",
    },
}

CERTS = {
    "secure.example.com": CertFiles(ca=("/etc/containers/certs.d/secure.example.com/ca.crt",)),
    "mirror.example.com:5000": CertFiles(
        ca=("/etc/docker/certs.d/mirror.example.com:5000/root.crt",),
        client=(
            (
                "/etc/docker/certs.d/mirror.example.com:5000/client.cert",
                "/etc/docker/certs.d/mirror.example.com:5000/client.key",
            ),
        ),
    ),
}


def run_case(files: dict[str, str]) -> str:
    main = None
    drop_ins = []
    yaml = None
    for name, text in sorted(files.items()):
        if name == "main":
            main = load_file(Path("/etc/containers/registries.conf"), text.encode(), drop_in=False)
        elif name == "registries.yaml":
            yaml = load_yaml(YAML, text.encode())
        else:
            drop_ins.append(load_file(D / name, text.encode(), drop_in=True))
    rendered = render(merge(main, drop_ins), yaml, CERTS)
    out = []
    for directory, text in rendered.files.items():
        parsed = tomllib.loads(text)  # every file must be valid TOML
        assert text.startswith(HEADER + "\n")
        assert "server" in parsed or directory == "_default"
        out.append(f"=== {directory}/hosts.toml\n{text}")
    out.append("=== warnings\n" + "".join(f"{w}\n" for w in rendered.warnings))
    return "\n".join(out)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    got = run_case(CASES[case])
    golden = GOLDEN / f"{case}.txt"
    if os.environ.get("REGEN_GOLDENS"):
        golden.write_text(got)
    assert got == golden.read_text()


def test_mirror_order_survives_toml_parsing() -> None:
    text = render(
        merge(
            None,
            [
                load_file(
                    D / "x.conf",
                    b'[[registry]]\nlocation = "a.com"\n'
                    + b"".join(f'[[registry.mirror]]\nlocation = "m{i}.com"\n'.encode() for i in (9, 1, 5)),
                    drop_in=True,
                )
            ],
        )
    ).files["a.com"]
    assert list(tomllib.loads(text)["host"]) == ["https://m9.com", "https://m1.com", "https://m5.com"]


GOOD = '[[registry]]\nlocation = "good.com"\n[[registry.mirror]]\nlocation = "m.good.com"\n'


@pytest.mark.parametrize(
    ("text", "entry", "fragment", "hosts"),
    [
        (
            '[[registry]]\nlocation = "../../etc"\n[[registry.mirror]]\nlocation = "m.com"\n',
            '[[registry]] #1 (location "../../etc")',
            "'..' is not a registry host[:port]; not expressible in hosts.toml, entry skipped",
            [],
        ),
        (
            '[[registry]]\nprefix = "a.com"\nlocation = "a.com"\n[[registry.mirror]]\nlocation = "m .com"\n'
            '[[registry.mirror]]\nlocation = "ok.com"\n',
            '[[registry]] #1 (prefix "a.com") mirror #1',
            "'m .com' is not a registry host[:port]; mirror skipped",
            ["a.com"],
        ),
        (
            '[[registry]]\nlocation = "a\\u0000b.com"\n[[registry.mirror]]\nlocation = "m.com"\n',
            '[[registry]] #1 (location "a\x00b.com")',
            "is not a registry host[:port]",
            [],
        ),
        (
            '[[registry]]\nlocation = "a.com:99999"\n[[registry.mirror]]\nlocation = "m.com"\n',
            '[[registry]] #1 (location "a.com:99999")',
            "'a.com:99999' is not a registry host[:port]",
            [],
        ),
        (
            '[[registry]]\nlocation = "a.com"\n[[registry.mirror]]\nlocation = "user@m.com"\n',
            '[[registry]] #1 (location "a.com") mirror #1',
            "'user@m.com' is not a registry host[:port]; mirror skipped",
            [],
        ),
        (
            '[[registry]]\nprefix = "a.com"\nlocation = "user@a.com"\n[[registry.mirror]]\nlocation = "m.com"\n',
            '[[registry]] #1 (prefix "a.com")',
            "location \"user@a.com\": 'user@a.com' is not a registry host[:port]",
            [],
        ),
        (
            '[[registry]]\nlocation = "user@a.com"\n',
            '[[registry]] #1 (location "user@a.com")',
            "'user@a.com' is not a registry host[:port]",
            [],
        ),
        (
            '[[registry]]\nprefix = "*"\nlocation = "a.com"\n[[registry.mirror]]\nlocation = "m.com"\n',
            '[[registry]] #1 (prefix "*")',
            "prefix \"*\": '*' is not a registry host[:port]; not expressible in hosts.toml, entry skipped",
            [],
        ),
        (
            '[[registry]]\nprefix = "**.example.com"\nlocation = "a.com"\n[[registry.mirror]]\nlocation = "m.com"\n',
            '[[registry]] #1 (prefix "**.example.com")',
            "'**.example.com' is not a registry host[:port]",
            [],
        ),
    ],
    ids=[
        "dotdot",
        "mirror-space",
        "nul",
        "port-range",
        "mirror-userinfo",
        "location-userinfo",
        "no-mirrors-userinfo",
        "prefix-star",
        "double-wildcard",
    ],
)
def test_entries_podman_loads_but_hosts_toml_cannot_express_are_skipped(
    text: str, entry: str, fragment: str, hosts: list[str]
) -> None:
    # containers/image checks none of these locations (only the URI scheme): podman loads the
    # file, so one such entry must not stop every other registry from being rendered.
    cfg = merge(
        None,
        [
            load_file(D / "bad.conf", text.encode(), drop_in=True),
            load_file(D / "good.conf", GOOD.encode(), drop_in=True),
        ],
    )
    rendered = render(cfg)
    assert sorted(rendered.files) == sorted([*hosts, "good.com"])
    (warning,) = [w for w in rendered.warnings if w.path == D / "bad.conf"]
    assert warning.entry == entry
    assert fragment in warning.message
    for text_ in rendered.files.values():
        tomllib.loads(text_)


@pytest.mark.parametrize(
    "name", ["50-\x1b[31m.conf", "50-\r.conf", "50-\x7f.conf", "50-\n[host].conf", "50-\udcff.conf"]
)
def test_file_names_cannot_break_out_of_the_source_comment(name: str) -> None:
    text = render(merge(None, [load_file(D / name, GOOD.encode(), drop_in=True)])).files["good.com"]
    text.encode("utf-8")  # an undecodable byte of a file name is escaped, not written raw
    parsed = tomllib.loads(text)
    assert list(parsed["host"]) == ["https://m.good.com"]
    source = text.splitlines()[1]
    assert source.startswith("# Source: /etc/containers/registries.conf.d/50-\\")
    assert _render.comment_text(name) in source


def test_comment_text_escapes_every_character_toml_forbids_in_comments() -> None:
    every = "".join(chr(c) for c in range(0x20)) + "\x7f\x85\u2028\udcff\\ok é"
    escaped = _render.comment_text(every)
    tomllib.loads(f"# {escaped}\n")
    assert escaped.endswith("\\x7f\\x85\\u2028\\udcff\\\\ok é")
    plain = "/etc/containers/registries.conf.d/50-x.conf"
    assert _render.comment_text(plain) == plain


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("mirrors:\n  ../x:\n    endpoint: [https://m.com]\n", "'../x' is not a valid registry host"),
        ("mirrors:\n  a.com:\n    endpoint: [ftp://m.com]\n", "invalid endpoint 'ftp://m.com'"),
        ("mirrors:\n  a.com:\n    endpoint: https://m.com\n", "must be a list of URLs"),
        ("mirrors: [a]\n", "mirrors: must be a mapping"),
        (
            "configs:\n  m.com:\n    tls:\n      cert_file: /c\n",
            "cert_file and key_file must be set together",
        ),
        ("mirrors: {a: [\n", "invalid YAML"),
    ],
    ids=["dotdot-host", "scheme", "endpoint-type", "mirrors-type", "half-pair", "syntax"],
)
def test_invalid_registries_yaml(text: str, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        load_yaml(YAML, text.encode())
    assert str(info.value).startswith(str(YAML))
    assert fragment in str(info.value)
