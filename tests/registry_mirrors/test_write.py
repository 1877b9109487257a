"""The writer: atomic replacement, ownership header, nothing outside hosts_dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from reloadd_registry_mirrors import HEADER, apply, is_owned

TEXT_A = f'{HEADER}\n# a\nserver = "https://a.com"\n'
TEXT_B = f'{HEADER}\n# b\nserver = "https://b.com"\n'


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()
    }


def test_writes_creates_and_reports(tmp_path: Path) -> None:
    hosts = tmp_path / "certs.d"
    result = apply(hosts, {"a.com": TEXT_A, "b.com:5000": TEXT_B})
    assert sorted(result.written) == ["a.com", "b.com:5000"]
    assert tree(hosts) == {"a.com/hosts.toml": TEXT_A, "b.com:5000/hosts.toml": TEXT_B}
    assert oct((hosts / "a.com" / "hosts.toml").stat().st_mode & 0o777) == "0o644"


def test_unchanged_content_is_not_rewritten(tmp_path: Path) -> None:
    apply(tmp_path, {"a.com": TEXT_A})
    ino = (tmp_path / "a.com" / "hosts.toml").stat().st_ino
    result = apply(tmp_path, {"a.com": TEXT_A})
    assert (result.written, result.unchanged, result.changed) == ([], ["a.com"], False)
    assert (tmp_path / "a.com" / "hosts.toml").stat().st_ino == ino


def test_rewrite_is_a_rename_never_an_in_place_write(tmp_path: Path) -> None:
    apply(tmp_path, {"a.com": TEXT_A})
    before = (tmp_path / "a.com" / "hosts.toml").stat().st_ino
    with open(tmp_path / "a.com" / "hosts.toml", "rb") as reader:  # a reader holding the old file
        apply(tmp_path, {"a.com": TEXT_B})
        assert reader.read().decode() == TEXT_A
    assert (tmp_path / "a.com" / "hosts.toml").stat().st_ino != before
    assert (tmp_path / "a.com" / "hosts.toml").read_text() == TEXT_B
    assert os.listdir(tmp_path / "a.com") == ["hosts.toml"]  # no temp file left


def test_removes_only_owned_directories(tmp_path: Path) -> None:
    apply(tmp_path, {"a.com": TEXT_A, "b.com": TEXT_B})
    foreign = tmp_path / "foreign.io"
    foreign.mkdir()
    (foreign / "hosts.toml").write_text('server = "https://foreign.io"\n')
    certs_only = tmp_path / "certs.io"
    certs_only.mkdir()
    (certs_only / "ca.crt").write_text("pem")
    (tmp_path / "b.com" / "ca.crt").write_text("pem")  # an owned dir that also holds a certificate
    result = apply(tmp_path, {})
    assert sorted(result.removed) == ["a.com", "b.com"]
    assert not (tmp_path / "a.com").exists()
    assert tree(tmp_path) == {
        "b.com/ca.crt": "pem",
        "certs.io/ca.crt": "pem",
        "foreign.io/hosts.toml": 'server = "https://foreign.io"\n',
    }


def test_foreign_file_for_a_rendered_host_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "a.com").mkdir()
    (tmp_path / "a.com" / "hosts.toml").write_text("# mine\n")
    result = apply(tmp_path, {"a.com": TEXT_A})
    assert result.written == []
    assert "not written by reloadd" in result.skipped["a.com"]
    assert (tmp_path / "a.com" / "hosts.toml").read_text() == "# mine\n"


def test_symlinks_are_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "hosts.toml").write_text(TEXT_A)  # looks owned, but lives elsewhere
    hosts = tmp_path / "hosts"
    hosts.mkdir()
    (hosts / "a.com").symlink_to(outside)
    (hosts / "b.com").mkdir()
    (hosts / "b.com" / "hosts.toml").symlink_to(outside / "hosts.toml")
    result = apply(hosts, {"a.com": TEXT_B, "b.com": TEXT_B})
    assert set(result.skipped) == {"a.com", "b.com"}
    assert (outside / "hosts.toml").read_text() == TEXT_A
    assert not is_owned(hosts / "a.com")
    apply(hosts, {})  # removal pass: symlinked dir is not ours
    assert (outside / "hosts.toml").read_text() == TEXT_A
    assert (hosts / "a.com").is_symlink()


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".", "", "a.com\0", "/etc"])
def test_names_that_are_not_hosts_are_refused(tmp_path: Path, name: str) -> None:
    hosts = tmp_path / "hosts"
    with pytest.raises(ValueError, match="not a valid registry host"):
        apply(hosts, {name: TEXT_A})
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["hosts"]


def test_is_owned_checks_the_first_line_exactly(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "hosts.toml").write_text(f"# note\n{HEADER}\n")
    assert not is_owned(tmp_path / "x")
    (tmp_path / "x" / "hosts.toml").write_text(f"{HEADER}\n")
    assert is_owned(tmp_path / "x")
    assert not is_owned(tmp_path / "missing")


def test_temp_files_of_a_killed_writer_are_swept(tmp_path: Path) -> None:
    apply(tmp_path, {"a.com": TEXT_A, "gone.com": TEXT_B})
    (tmp_path / "a.com" / ".hosts.toml.4242.tmp").write_text("half")  # SIGKILL between write and rename
    (tmp_path / "gone.com" / ".hosts.toml.4243.tmp").write_text("half")
    (tmp_path / "new.com").mkdir()
    (tmp_path / "new.com" / ".hosts.toml.4244.tmp").write_text("half")  # killed on its very first write
    (tmp_path / "a.com" / "ca.crt").write_text("not ours: kept")
    apply(tmp_path, {"a.com": TEXT_A, "new.com": TEXT_B})
    assert tree(tmp_path) == {"a.com/ca.crt": "not ours: kept", "a.com/hosts.toml": TEXT_A,
                              "new.com/hosts.toml": TEXT_B}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (f"{HEADER}\n# Source: 50-\x1b.conf\nserver = \"https://a.com\"\n", "is not valid TOML"),
        (f'{HEADER}\nserver = "https://a.com"\n[host."https://m.com"\n', "is not valid TOML"),
        (f'{HEADER}\n# Source: 50-\udcff.conf\nserver = "https://a.com"\n', "is not encodable as UTF-8"),
        ('server = "https://a.com"\n', "does not start with the ownership header"),
    ],
    ids=["control-char-in-comment", "syntax", "surrogate", "no-header"],
)
def test_text_that_does_not_parse_back_never_replaces_the_old_file(tmp_path: Path, text: str, fragment: str) -> None:
    apply(tmp_path, {"a.com": TEXT_A, "b.com": TEXT_A})
    result = apply(tmp_path, {"a.com": text, "b.com": TEXT_B, "c.com": text})
    assert (tmp_path / "a.com" / "hosts.toml").read_text() == TEXT_A  # the old file stays
    assert not (tmp_path / "c.com").exists()  # nothing created for a new host either
    assert tree(tmp_path) == {"a.com/hosts.toml": TEXT_A, "b.com/hosts.toml": TEXT_B}
    assert sorted(result.invalid) == ["a.com", "c.com"]
    assert result.invalid["a.com"].startswith(f"generated {tmp_path / 'a.com' / 'hosts.toml'} {fragment}")
    assert (result.written, result.removed) == (["b.com"], [])
