"""The ``kube-manifests`` consumer: a folder of manifests, kept applied to a cluster.

Files: ``.yaml``, ``.yml`` and ``.json`` (any case), recursively; dotfiles and files under dot-directories
are ignored; ``X.skip`` beside ``X`` disables ``X`` (its objects are removed, as if ``X`` were deleted,
and come back when the ``.skip`` file goes). Each file is one ApplySet (see ``_applyset``).

Within a batch, files that exist are applied before deleted files are removed, so a rename (delete +
add in one batch) re-labels the objects into the new file's set before the old set is emptied, and
nothing is deleted.

Batches run concurrently (``concurrency``, default 16), so a file stuck in retries does not hold back the
others. What they share is safe for that: discovery refreshes under its own lock, each file is its own
ApplySet, and no delete pass removes an object another file wants (see ``_claims``), so a rename or a move
split over two concurrent batches deletes nothing.

A move whose delete arrives first (``mkdir new && mv dir/app.yaml new/``: the new folder's file is found only
once the folder is watched) is covered by the move grace (see ``_moves``): the removal of a deleted file
answers ``Retry`` for up to ``move_grace`` seconds, so a file that declares its objects can take them over
first, and the delete is acknowledged only once the removal has run.

Guarded objects: the ``kube-watch`` source (see ``_watch``) watches the members of every file and reports a
member deleted, or a field reloadd owns changed by another manager, as drift of the file; the ledger (see
``_ledger``) is what each file applied, kept here and in each record's ``owned``.

Prune safety: the core holds the deletions of a root that looks lost (see ``reloadd._pipeline._prune``); this
consumer adds ``max_prune``, a limit on the objects deleted files remove in one pass (see
:meth:`~._parts.prune.PrunePart._over_max_prune`), and records a Warning Event on the parent of every held
removal.

Code layout: this class is composed of parts, one concern each, in ``_parts`` (apply, prune, drift, health,
waves, lease, plan; see ``_parts/__init__``); what stays here is the pass (:meth:`handle` and its steps), the
connection and the lifecycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from reloadd import (
    Ack,
    Batch,
    Change,
    ChangeKind,
    DriftMode,
    Hold,
    PermanentError,
    Reason,
    Reject,
    ReloaddError,
    Result,
    Retry,
    result_of,
)

from ._apply import Applier
from ._applyset import ObjRef
from ._client import KubeClient
from ._discovery import Discovery
from ._gate import WaveError, needs, wave_of
from ._kubeconfig import load_cluster_config
from ._lease import LeaderElector, LeaseSettings
from ._manifests import load_manifest
from ._parts.apply import ApplyPart
from ._parts.base import SKIP_SUFFIX, _marked
from ._parts.drift import DriftPart
from ._parts.health import HealthPart
from ._parts.lease import LeasePart
from ._parts.plan import PlanPart
from ._parts.prune import PrunePart
from ._parts.waves import WavePart

__all__ = ["KubeManifestsConsumer"]

_VERSION = "0.1.0"

_STANDBY_RECHECK = 30.0
"""Seconds a standby defers a change before looking again (becoming the leader hands everything over at once)."""


class KubeManifestsConsumer(ApplyPart, PrunePart, DriftPart, HealthPart, WavePart, LeasePart, PlanPart):
    """Server-side applies manifest files and prunes what they no longer contain.

    Args:
        ctx: The engine's context.
        settings: Validated options.

    Each concern is a part (see ``_parts``); the state they share is built by
    :class:`~._parts.base.ConsumerBase`.
    """

    # --- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the kubeconfig (errors here are configuration errors); discovery happens lazily.

        The members of every recorded file are loaded for the ``kube-watch`` source; files recorded by
        an older reloadd (no ``owned`` in their record) are handed over again, so they are guarded too.
        """
        await self._connect()
        if not self._ledger_loaded:
            self._ledger_loaded = True
            bare = self.ledger.load(self.ctx.records.items())
            if bare and self.ctx.drift is not DriftMode.OFF and not self.settings.dry_run:
                self.ctx.trigger(bare)
            if self._tracking:
                self._restore_health()
            await self._expect_new_providers()
        if self.settings.resync_interval > 0 and self._resync is None:
            self._resync = asyncio.create_task(self._resync_loop(), name=f"reloadd-{self.name}-resync")

    async def _connect(self, elect: bool = True) -> None:
        config = await asyncio.to_thread(load_cluster_config, self.settings.kubeconfig, self.settings.context)
        s = self.settings
        if s.leader_elect and elect and self.elector is None:
            # Its own client (own connections, short timeout, no retry): lease traffic never waits behind applies.
            lease_client = KubeClient(config, user_agent=f"reloadd/{_VERSION} (kube-manifests lease)", attempts=1,
                                      timeout=max(1.0, s.renew_deadline / 2))
            name = s.lease_name or "reloadd-" + re.sub(r"[^a-z0-9.-]+", "-", self.name.lower()).strip("-.")
            self.elector = LeaderElector(
                lease_client, LeaseSettings(name, s.lease_namespace or s.namespace, s.lease_duration,
                                            s.renew_deadline, s.retry_period),
                on_started=self._became_leader, on_stopped=self._stood_by, logger=self.log)
            self.stats["leader"] = 0
            self._electing = asyncio.create_task(self.elector.run(), name=f"reloadd-{self.name}-lease")
        fence = self.elector.may_write if self.elector is not None else None
        self.client = KubeClient(config, user_agent=f"reloadd/{_VERSION} (kube-manifests)", fence=fence)
        self.discovery = Discovery(self.client)
        self.applier = Applier(
            self.client, self.discovery, self.settings, default_namespace=config.namespace,
            tooling=f"reloadd/{_VERSION}", logger=self.log,
        )

    async def close(self) -> None:
        """Stop the resync timer and the move-grace timers, release the Lease, and close the HTTP connection pool."""
        if self._foreign_task is not None:
            self._foreign_task.cancel()
        if self._electing is not None:
            self._electing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._electing
            self._electing = None
        if self.elector is not None:
            await self.elector.release()
            await self.elector.client.close()
        self._moves.close()
        self._book.close()
        for task in list(self._event_tasks):  # a failure being announced: its Event is lost with the process
            task.cancel()
        if self._resync is not None:
            self._resync.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._resync
            self._resync = None
        if self.client is not None:
            await self.client.close()

    async def _ready(self) -> Applier:
        async with self._ready_lock:  # concurrent batches: connect and discover once
            if self.applier is None or self.discovery is None:
                await self.start()
            assert self.applier is not None and self.discovery is not None
            if not self._discovered:
                await self.discovery.load()
                self._discovered = True
            return self.applier

    # --- handling ------------------------------------------------------------------------------------
    async def handle(self, batch: Batch) -> Mapping[Path, Result]:
        """Apply existing files (concurrently), then remove deleted ones; a standby defers everything."""
        if self._standing_by():
            # Not acknowledged: becoming the leader hands every file over again (forced), these included.
            why = self.status_note or "standby"
            return {c.path: Retry(why, after=_STANDBY_RECHECK, failure=False) for c in batch.changes}
        try:
            applier = await self._ready()
        except ReloaddError as exc:
            self.log.warning("Failed to read the API server's discovery: %s", exc)
            # The core's policy (a transient failure retried, a permanent one rejected), said of discovery.
            return dict.fromkeys(batch.paths, result_of(exc, self.name, "API discovery", name_path=True))
        live = [c for c in batch.changes if c.kind is not ChangeKind.DELETED]
        gone = [c for c in batch.changes if c.kind is ChangeKind.DELETED]
        results = self._skip_markers(live + gone)
        claimed: set[ObjRef] = set()  # what the batch's existing files declare: never removed below

        # Every existing file at once (each settles on its own), then the removals one by one, so
        # nothing a file of this batch declares is pruned.
        files = [c for c in live if c.path.suffix.lower() != SKIP_SUFFIX]
        results.update(await self._apply_files(batch, applier, files, claimed))
        self._limit_held.difference_update(c.path for c in live)
        gone = [c for c in gone if c.path.suffix.lower() != SKIP_SUFFIX]
        results.update(await self._remove_files(batch, applier, gone, claimed))
        self.stats["files_failed"] += sum(isinstance(results[c.path], Reject) for c in files + gone)
        self.stats["api_requests"] = applier.client.stats["requests"]
        self.stats["api_retries"] = applier.client.stats["retries"]
        self.stats["api_dropped"] = applier.client.stats["dropped"]
        return results

    def _skip_markers(self, changes: Sequence[Change]) -> dict[Path, Result]:
        """Acknowledge the ``.skip`` markers among ``changes``, and have the file each marks handed over again."""
        results: dict[Path, Result] = {}
        skip_markers = [c for c in changes if c.path.suffix.lower() == SKIP_SUFFIX]
        for c in skip_markers:
            results[c.path] = Ack({"skip_marker_for": str(c.path.with_suffix(""))})
        if skip_markers:
            # The marked file itself did not change: have the engine hand it over again.
            self.ctx.trigger([c.path.with_suffix("") for c in skip_markers])
        return results

    async def _apply_files(self, batch: Batch, applier: Applier, files: list[Change],
                           claimed: set[ObjRef]) -> dict[Path, Result]:
        """Apply the batch's existing files, providers and earlier waves first; what they declare joins ``claimed``."""
        drift = batch.reason is Reason.DRIFT

        async def apply(change: Change) -> Result:
            manifest = None
            try:
                if not self._unchanged(change) and not _marked(change.path):
                    with contextlib.suppress(ReloaddError):  # the apply below loads it again and reports it
                        manifest = await load_manifest(change.path, max_bytes=self.settings.max_file_size)
                    if manifest is not None:
                        try:
                            wave = wave_of(manifest)
                        except WaveError as exc:
                            self._book.removed(change.path)
                            return Reject(f"{change.path}: {exc}")
                        if wave:
                            await self._wait_wave(change.path, wave)
                        if not self._gate.providing(change.path) and await self._gate.wait(
                                change.path, needs(manifest)):
                            self.stats["files_waited_for_provider"] += 1
                async with self._files:
                    return await self._one(applier, change, claimed, drift=drift, manifest=manifest)
            finally:
                self._gate.done(change.path)
                if self._wave_pending.pop(change.path, None) is not None:
                    self._wave_moved.set()

        # Order by health across the folder (see ``_gate``): the files that create namespaces and CRDs first,
        # then lexical order, as ``kubectl apply -f DIR``; the files that need them wait for them.
        providers = await self._expect([c.path for c in files if not _marked(c.path)], waves=True)
        files.sort(key=lambda c: (self._waves.get(c.path, 0),
                                  c.path not in providers and not self._gate.providing(c.path), str(c.path)))
        # As many at once as may apply (the semaphore is shared across batches): no task per waiting file.
        return await self.each(batch, files, apply, limit=self.concurrency)

    async def _remove_files(self, batch: Batch, applier: Applier, gone: list[Change],
                            claimed: set[ObjRef]) -> dict[Path, Result]:
        """Remove the batch's deleted files one by one, sparing ``claimed``; over ``max_prune``, hold them."""
        over = self._over_max_prune(gone)

        async def remove(change: Change) -> Result:
            if over is not None and not change.prune_confirmed:
                self._moves.done(change.path)
                self._limit_held.add(change.path)
                return Hold(over)
            try:
                async with self._files:
                    result = await self._one(applier, change, claimed)
            except PermanentError:
                self._moves.done(change.path)  # given up: nothing waits for it any more
                raise
            if not isinstance(result, Retry):
                self._moves.done(change.path)  # removed (or given up): nothing waits for it any more
            return result

        return await self.each(batch, gone, remove, at_once=False)
