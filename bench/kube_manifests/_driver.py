"""Feeds the kube-manifests consumer the way the engine does, for the benchmarks."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from reloadd_kube_manifests import create

from reloadd import Ack, Batch, Change, ChangeKind, ConsumerContext, Fingerprint, PathRecord, Reason, Result, Retry


class Driver:
    """One consumer fed one batch at a time; records are kept from the results as the engine keeps them.

    Args:
        root: The watched folder.
        options: The consumer's options (``kubeconfig`` at least).
        strict: Raise on any result but Ack (the synthetic benchmark); otherwise return them.
    """

    def __init__(self, root: Path, options: dict[str, Any], *, strict: bool = True) -> None:
        self.root = root
        self.strict = strict
        self.records: dict[Path, PathRecord] = {}
        ctx = ConsumerContext(name="bench", paths=(root,), options=options,
                              state_dir=root.parent / f"state-{root.name}", records=self.records)
        self.consumer = create(ctx)

    async def sync(self, paths: list[Path]) -> dict[Path, Result]:
        """Hand ``paths`` over in one batch; their results (Retry leaves the record as it was)."""
        changes = []
        for p in paths:
            kind = ChangeKind.MODIFIED if p in self.records else ChangeKind.ADDED
            digest = hashlib.sha256(p.read_bytes()).hexdigest()
            changes.append(Change(p, kind, Fingerprint.from_stat(p.stat()), digest, False, self.root))
        results = dict(await self.consumer.handle(Batch("bench", Reason.INOTIFY, tuple(changes))))
        for c in changes:
            res = results[c.path]
            if self.strict and not isinstance(res, Ack):
                raise RuntimeError(f"{c.path}: {res}")
            if not isinstance(res, Retry):
                self.records[c.path] = PathRecord(c.fingerprint, c.digest, getattr(res, "data", None))
        return results
