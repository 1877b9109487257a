"""One file's turn in a pass: applied (or its objects removed), then its result, its warnings and Events.

A part of :class:`~reloadd_kube_manifests.KubeManifestsConsumer` (see ``_parts``); the batch's order
(providers and waves first, removals last) is ``handle``'s, in ``_consumer``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

from reloadd import Ack, Change, ChangeKind, Reject, Result, Retry

from .._apply import Applier
from .._applyset import ObjRef
from .._events import record_event
from .._manifests import Manifest, load_manifest
from .._outcome import FileOutcome
from .base import APPLY_FAILED, ConsumerBase, _marked

__all__ = ["ApplyPart"]

_EVENT_AFTER_RETRIES = 3
"""Consecutive transient results of a file before a Warning Event is recorded for it."""


class ApplyPart(ConsumerBase):
    """Applies or removes one file and turns its outcome into the core's result."""

    async def _one(self, applier: Applier, change: Change, claimed: set[ObjRef], *, drift: bool = False,
                   manifest: Manifest | None = None) -> Result:
        self.ledger.begin(change.path)
        try:
            return await self._one_file(applier, change, claimed, drift=drift, manifest=manifest)
        finally:
            self._book.abandon(change.path)
            self._settled(change.path)

    async def _one_file(self, applier: Applier, change: Change, claimed: set[ObjRef], *, drift: bool,
                        manifest: Manifest | None = None) -> Result:
        path = change.path
        skipped = change.kind is not ChangeKind.DELETED and _marked(path)
        if change.kind is not ChangeKind.DELETED:
            self._moves.done(path)  # back (or a .skip beside it): no removal waits any more
        elif not change.prune_confirmed and (wait := await self._move_wait(applier, path, claimed)) > 0:
            # No seconds in the text: status counts down the deferral's own retry_in at read time.
            return Retry("removal waits for another file to declare its objects (move_grace)",
                         after=wait, failure=False)
        if change.kind is ChangeKind.DELETED or skipped:
            out = await applier.remove_file(self.key(path), keep=claimed)
            self.ledger.removed(path)
            self._book.removed(path)
            self._removed.append((time.monotonic(), len(out.pruned)))
            self._limit_held.discard(path)
            self.stats["files_removed"] += 1
            data = {**out.to_data(), "skipped": True} if skipped else out.to_data()
            return await self._result(path, out, data, "remove")
        record = self.ctx.records.get(path)
        previous = record.data if record is not None and isinstance(record.data, dict) else None
        if self._unchanged(change):
            return Ack(previous)
        self._book.applying(path, _saved(path, self.settings.health_timeout))
        if manifest is None:
            manifest = await load_manifest(path, max_bytes=self.settings.max_file_size)
        # A drift correction re-applies the file; only an operator's forced pass also lists every kind.
        out = await applier.apply_file(self.key(path), str(path), manifest, thorough=change.forced and not drift)
        owned = self.ledger.applied(path, out.applyset, out.answers) if not self.settings.dry_run else {}
        if self._watch is not None:
            self._watch.forget_reports(path)
        claimed.update(out.desired)
        self._moves.adopted(applier.claims.wanted_by_others)
        self.stats["files_applied"] += 1
        self.stats["objects_applied"] += out.applied
        if out.errors:
            self._book.apply_failed(path, APPLY_FAILED, out.summary())
        elif out.transient:
            # Retried by the core (which shows it failing): judged once applied whole; `after` goes by the core's
            # rule for a retrying path meanwhile, as before health was tracked.
            self._book.abandon(path)
        elif self._tracking:
            self._book.applied(path, out.answers, tuple(sorted(out.desired)))
        else:
            self._book.untracked(path)
        await self._warn(path, out, previous)
        return await self._result(path, out, {**out.to_data(), "owned": owned}, "apply")

    async def _warn(self, path: Path, out: FileOutcome, previous: Mapping[str, object] | None) -> None:
        """Report the server's warnings (deprecated APIs) once per file content: a log line and an Event."""
        if not out.warnings:
            self._warned.pop(path, None)
            return
        seen = self._warned.get(path) == out.sha256 or (
            previous is not None and previous.get("sha256") == out.sha256 and previous.get("warnings") == out.warnings
        )
        self._warned[path] = out.sha256
        if seen:
            return
        text = "; ".join(out.warnings)
        self.log.warning("The API server warned about %s: %s", path, text)
        await self._event(out, "ApplyWarning", f"{path}: {text}")

    async def _event(self, out: FileOutcome, reason: str, message: str) -> None:
        if self.client is None or self.settings.dry_run:
            return
        ns, _, name = out.parent.partition("/")
        await record_event(self.client, ns, name, reason=reason, message=message, warning=True,
                           component=f"reloadd/{self.name}", log=self.log)

    async def _result(self, path: Path, out: FileOutcome, data: dict[str, object], verb: str) -> Result:
        self.stats["objects_pruned"] += len(out.pruned)
        if out.transient and not out.errors:
            tries = self._retrying[path] = self._retrying.get(path, 0) + 1
        else:
            tries = 0
            self._retrying.pop(path, None)
        # A transient failure usually heals on the next pass (a custom resource whose CRD another file is
        # still establishing): only a file that keeps failing leaves a Warning Event behind.
        if out.errors or tries >= _EVENT_AFTER_RETRIES:
            reason = "ApplyFailed" if verb == "apply" else "RemoveFailed"
            await self._event(out, reason, f"{path}: {out.summary()}")
        if out.transient:
            self.log.debug("Failed to %s %s (will retry): %s", verb, path, out.summary())
            return Retry(out.summary())
        if out.errors:
            self.log.debug("Failed to %s %s (retried when it changes, or on SIGHUP): %s", verb, path,
                             out.summary())
            return Reject(out.summary(), data)
        self.log.info("%s %s: %d applied, %d pruned", "Applied" if verb == "apply" else "Removed", path,
                      out.applied, len(out.pruned))
        return Ack(data)


def _saved(path: Path, horizon: float) -> float:
    """When ``path`` was saved (Unix time), for save → current; a file older than ``horizon`` seconds (the
    start-up pass over a folder written long ago) counts from now."""
    now = time.time()
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        return now
    return mtime if 0 <= now - mtime <= horizon else now
