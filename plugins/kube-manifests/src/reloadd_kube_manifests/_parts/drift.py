"""Guarded objects: the ``kube-watch`` source, drift reports, ``plan_drift``, and the resync timer.

A part of :class:`~reloadd_kube_manifests.KubeManifestsConsumer` (see ``_parts``). The ``kube-watch`` source
(see ``_watch``) watches the members of every file and reports a member deleted, or a field reloadd owns
changed by another manager, as drift of the file; the ledger (see ``_ledger``) is what each file applied.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from reloadd import Drift, Plan, PlannedChange, Source, SourceContext

from .._applyset import ObjRef, parent_name
from .._client import KubeClient
from .._discovery import Discovery
from .._events import record_event
from .._ledger import Ledger
from .._watch import ObjectWatch, list_members
from .base import ConsumerBase

__all__ = ["DriftPart"]


class _WatchFactory:
    """Builds the consumer's ``kube-watch`` source (the core calls it after the consumer started)."""

    name = ObjectWatch.name

    def __init__(self, consumer: DriftPart) -> None:
        self.consumer = consumer

    def __call__(self, ctx: SourceContext) -> ObjectWatch:
        c = self.consumer
        c._watch = ObjectWatch(ctx, consumer=c.name, ledger=c.ledger, connect=c._connected, mode=c.ctx.drift,
                               report=c._report_drift, stats=c.stats, active=lambda: not c._standing_by(),
                               observe=c._book.observe)
        return c._watch


class DriftPart(ConsumerBase):
    """Guards what the files applied: the watch source, its reports, the drift plan, the resync timer."""

    def sources(self) -> Sequence[Callable[[SourceContext], Source]]:
        """The ``kube-watch`` source (guarded objects); none in ``dry_run`` (nothing is applied to guard)."""
        return () if self.settings.dry_run else (_WatchFactory(self),)

    def _members_changed(self) -> None:
        if self._watch is not None:
            self._watch.changed()

    async def _connected(self) -> tuple[KubeClient, Discovery]:
        await self._ready()
        assert self.client is not None and self.discovery is not None
        return self.client, self.discovery

    async def _report_drift(self, path: Path, drift: Drift) -> None:
        """``drift = "detect"``: a Warning Event ``Drifted`` on the file's ApplySet parent."""
        if self.client is None:
            return
        await record_event(
            self.client, self.settings.namespace, parent_name(self.key(path)), reason="Drifted",
            message=f"{drift} (declared by {path}); drift = \"detect\": left as it is until the file is applied "
                    "again (an edit, or `reloadd reload`)",
            warning=True, component=f"reloadd/{self.name}", log=self.log,
        )

    def _settled(self, path: Path) -> None:
        """``path``'s apply or removal answered: judge the watch events that waited for it."""
        for file, drift in self.ledger.end(path):
            if self._watch is not None:
                self._watch.emit(file, drift)

    async def _resync_loop(self) -> None:
        """Force a pass over every file now and then, so edits made in the cluster are undone."""
        while True:
            await asyncio.sleep(self.settings.resync_interval)  # a timer, not a synchronisation
            self.log.debug("Resync: re-applying every manifest")
            self.ctx.trigger(None)

    async def plan_drift(self, paths: Sequence[Path]) -> Plan:
        """Members of these recorded files deleted, or with fields reloadd owns changed by another manager.

        Read-only: one list per kind × namespace (the ``kube-watch`` source's first step), judged by a
        ledger of these files' records.
        """
        if self.applier is None:
            await self._connect(elect=False)
        await self._ready()
        assert self.client is not None and self.discovery is not None
        wanted = set(paths)
        ledger = Ledger(self.settings.field_manager)
        ledger.load((p, r) for p, r in self.ctx.records.items() if p in wanted)
        found: dict[Path, list[PlannedChange]] = {}

        def judge(event: str, ref: ObjRef, obj: Mapping[str, Any] | None) -> None:
            got = ledger.judge(event, ref, obj)
            if got is not None:
                found.setdefault(got[0], []).append(PlannedChange.drift(got[1].what, got[1].why, got[1].kind,
                                                                        got[1].by))

        for group, kind, ns in sorted(ledger.kinds()):
            res = await self.discovery.resolve_group_kind(group, kind)
            if res is not None:
                await list_members(self.client, res, group, kind, ns if res.namespaced else "", ledger, judge)
        return found
