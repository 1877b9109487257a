"""Test support: a harness that drives the consumer like the engine does, and manifest builders."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from reloadd_kube_manifests import KubeManifestsConsumer, create

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
)
from tests.kube.apiserver import KubeCluster

__all__ = ["Harness", "KubeCluster", "cm"]


class Harness:
    """Drives a real consumer the way the engine would: batches in, records kept from results."""

    def __init__(self, kube: KubeCluster, root: Path, name: str, options: Mapping[str, Any]) -> None:
        self.kube = kube
        self.root = root
        self.name = name
        self.records: dict[Path, PathRecord] = {}
        self.triggered: list[Path] = []
        self.resynced = asyncio.Event()  # set when the consumer asks for a pass over every path
        ctx = ConsumerContext(
            name=name, paths=(root,), options=dict(options), state_dir=root.parent / f"{name}-state",
            records=self.records, trigger=self._trigger,
        )
        self.consumer: KubeManifestsConsumer = create(ctx)

    def _trigger(self, paths: Iterable[Path] | None) -> None:
        if paths is None:
            self.resynced.set()
        else:
            self.triggered.extend(paths)

    def write(self, rel: str, content: str | bytes | list[dict[str, Any]]) -> Path:
        """Write a manifest (a list of objects is written as a YAML stream of JSON docs)."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, list):
            content = "\n---\n".join(json.dumps(o) for o in content) + "\n"
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        return path

    def change(self, path: Path, *, forced: bool = False) -> Change:
        """The change the engine would hand over for ``path`` now."""
        if not path.exists():
            return Change(path, ChangeKind.DELETED, None, forced=forced, root=self.root)
        kind = ChangeKind.MODIFIED if path in self.records else ChangeKind.ADDED
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        return Change(path, kind, Fingerprint.from_stat(path.stat()), digest, forced, self.root)

    async def sync(self, *paths: Path, forced: bool = False) -> dict[Path, Result]:
        """Hand ``paths`` over in one batch; update the records like the engine; return the results."""
        changes = tuple(self.change(p, forced=forced) for p in paths)
        batch = Batch(self.name, Reason.SIGNAL if forced else Reason.INOTIFY, changes)
        results = dict(await self.consumer.handle(batch))
        for c in changes:
            res = results.get(c.path, Ack())
            if isinstance(res, Ack):
                if c.kind is ChangeKind.DELETED:
                    self.records.pop(c.path, None)
                else:
                    self.records[c.path] = PathRecord(c.fingerprint, c.digest, res.data)
            elif isinstance(res, Reject):
                self.records[c.path] = PathRecord(c.fingerprint, c.digest, res.data, res.error)
        return results


def cm(name: str, namespace: str, **data: str) -> dict[str, Any]:
    """A ConfigMap manifest."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace},
            "data": dict(data)}
