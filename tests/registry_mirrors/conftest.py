"""Fixtures: a registry-mirrors consumer on real tmp directories, and a batch builder."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from reloadd_registry_mirrors import RegistryMirrorsConsumer, create

from reloadd import (
    Ack,
    Batch,
    Change,
    ChangeKind,
    ConsumerContext,
    Fingerprint,
    PathRecord,
    Reason,
    Reject,
    Result,
    Retry,
)


@dataclass
class Env:
    """A consumer's world: inputs, output dir, engine-like records and triggers."""

    tmp: Path
    main: Path
    conf_d: Path
    yaml: Path
    hosts: Path
    records: dict[Path, PathRecord] = field(default_factory=dict)
    triggered: list[list[Path]] = field(default_factory=list)

    def consumer(self, **options: Any) -> RegistryMirrorsConsumer:
        opts: dict[str, Any] = {
            "registries_conf": str(self.main),
            "registries_conf_d": str(self.conf_d),
            "registries_yaml": str(self.yaml),
            "hosts_dir": str(self.hosts),
            "certs_dirs": [],
            "containerd_config": "",
        }
        opts.update(options)
        opts = {k: v for k, v in opts.items() if v is not None}
        ctx = ConsumerContext(
            name="mirrors",
            paths=(),
            options=opts,
            state_dir=self.tmp / "state",
            records=self.records,
            trigger=lambda paths: self.triggered.append(list(paths or [])),
            logger=logging.getLogger("reloadd.consumer.mirrors"),
        )
        return create(ctx)

    def batch(self, *paths: Path, forced: bool = False) -> Batch:
        changes = []
        for p in paths:
            if p.exists():
                kind = ChangeKind.MODIFIED if p in self.records else ChangeKind.ADDED
                fp: Fingerprint | None = Fingerprint.from_stat(p.stat())
            else:
                kind, fp = ChangeKind.DELETED, None
            changes.append(Change(p, kind, fp, forced=forced))
        return Batch("mirrors", Reason.INOTIFY, tuple(changes))

    def remember(self, results: Mapping[Path, Result]) -> None:
        """Do what the engine does with results: keep records (errors from Rejects)."""
        for path, result in results.items():
            if not path.exists():
                self.records.pop(path, None)
                continue
            if isinstance(result, Retry):
                continue  # the engine keeps the old record and hands the path over again
            error = result.error if isinstance(result, Reject) else None
            self.records[path] = PathRecord(Fingerprint.from_stat(path.stat()), data=result.data, error=error)

    def hosts_files(self) -> dict[str, str]:
        if not self.hosts.exists():
            return {}
        return {str(p.relative_to(self.hosts)): p.read_text() for p in sorted(self.hosts.rglob("hosts.toml"))}

    def all_files(self) -> set[Path]:
        return {p for p in self.tmp.rglob("*") if p.is_file()}


@pytest.fixture
def env(tmp_path: Path) -> Env:
    conf_d = tmp_path / "etc" / "registries.conf.d"
    conf_d.mkdir(parents=True)
    return Env(
        tmp=tmp_path,
        main=tmp_path / "etc" / "registries.conf",
        conf_d=conf_d,
        yaml=tmp_path / "etc" / "registries.yaml",
        hosts=tmp_path / "certs.d",
    )


def mirror_conf(prefix: str, *mirrors: str, insecure: bool = True) -> str:
    """A drop-in mirroring ``prefix`` to ``mirrors`` (plain-HTTP local registries by default)."""
    out = f'[[registry]]\nprefix = "{prefix}"\nlocation = "{prefix}"\n'
    for m in mirrors:
        out += f'[[registry.mirror]]\nlocation = "{m}"\n' + ("insecure = true\n" if insecure else "")
    return out


def ack_data(result: Result) -> dict[str, Any]:
    """The data of an Ack (fails the test on anything else)."""
    assert isinstance(result, Ack), result
    assert isinstance(result.data, dict), result.data
    return result.data


def rejected(result: Result) -> str:
    """The error of a Reject (fails the test on anything else)."""
    assert isinstance(result, Reject), result
    return result.error


def paths_of(results: Iterable[Path]) -> list[str]:
    return sorted(p.name for p in results)
