"""Guarded objects: Kubernetes watches as a far-side change source (``kube-watch``).

One watch per kind × namespace the files' members live in (cluster-scoped kinds: one watch), selecting
ApplySet members (label ``applyset.kubernetes.io/part-of`` present: adding a file never restarts a
watch; members of other tools' ApplySets are dropped on arrival). Each watch lists first, judges every
listed object and every member missing from the list, then watches from the list's
``resourceVersion`` with bookmarks, so a quiet watch keeps a fresh one. The server ending a watch (its
``timeoutSeconds``, 5 to 10 minutes) resumes from the last ``resourceVersion``; a ``410 Gone`` (too old:
the apiserver restarted, or the watch was away too long) lists again, and that list finds what
drifted meanwhile. Connection loss retries with the core's backoff, resuming where it was.

What is drift is the ledger's call (see ``_ledger``): a member deleted, or a field reloadd owns taken
over by another manager. Each becomes one ``DRIFTED`` event for the file that declared the object; in
``drift = "detect"`` mode the file's ApplySet parent also gets a Warning Event ``Drifted``, once per
object until the file is applied again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reloadd import Backoff, Drift, DriftMode, EventKind, SourceContext, SourceEvent

from ._applyset import LABEL_PART_OF, ObjRef
from ._client import ApiError, ApiUnavailable, KubeClient
from ._discovery import Discovery, Resource
from ._ledger import Ledger, ref_of

__all__ = ["ObjectWatch", "list_members"]

_TIMEOUT = (300, 600)
"""The server ends each watch after a random number of seconds in this range (as client-go asks)."""


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


@dataclass(frozen=True, slots=True)
class _Target:
    group: str
    kind: str
    namespace: str  # "" for cluster-scoped kinds
    resource: Resource

    @property
    def collection(self) -> str:
        return self.resource.path(self.namespace or None)


async def list_members(client: KubeClient, resource: Resource, group: str, kind: str, namespace: str, ledger: Ledger,
                       judge: Callable[[str, ObjRef, Mapping[str, Any] | None], None]) -> str:
    """List the ApplySet members of one kind in one namespace (``""``: cluster-scoped) and hand ``judge`` each
    listed object (as ``MODIFIED``) and each member the ledger expects that is missing (as ``DELETED``).

    The first step of every watch (and of every relist), and what ``reloadd plan`` does to show drift.
    Returns the list's resourceVersion.
    """
    listed = await client.get(resource.path(namespace or None), {"labelSelector": LABEL_PART_OF})
    seen: set[ObjRef] = set()
    for item in (listed or {}).get("items") or ():
        if isinstance(item, Mapping):
            ref = ref_of(group, kind, item)
            seen.add(ref)
            judge("MODIFIED", ref, item)
    rv = str(((listed or {}).get("metadata") or {}).get("resourceVersion") or "")
    for ref in ledger.expected(group, kind, namespace):
        # A member whose apply answered after the list's snapshot (it joined the ledger while the list was on
        # its way: the first pass) is not missing: the watch from this resourceVersion brings its ADDED.
        if ref not in seen and not ledger.applied_after(ref, rv):
            judge("DELETED", ref, None)
    return rv


class ObjectWatch:
    """The ``kube-watch`` source of one ``kube-manifests`` consumer.

    Args:
        ctx: The source context (``emit``).
        consumer: Its consumer's name.
        ledger: The consumer's members and drift judge.
        connect: Returns the consumer's client and discovery, connecting first if needed.
        mode: The consumer's ``drift`` mode.
        report: Called with (file, drift) in ``detect`` mode (the consumer records a Warning Event).
        active: Whether drift is this process's to act on (a standby's is not: the leader's is).
        observe: Called with every listed or watched member (``None``: deleted): the health book's feed.
    """

    name = "kube-watch"

    def __init__(self, ctx: SourceContext, *, consumer: str, ledger: Ledger,
                 connect: Callable[[], Awaitable[tuple[KubeClient, Discovery]]], mode: DriftMode,
                 report: Callable[[Path, Drift], Coroutine[Any, Any, None]] | None = None,
                 stats: dict[str, float] | None = None, active: Callable[[], bool] = lambda: True,
                 observe: Callable[[ObjRef, Mapping[str, Any] | None], None] | None = None) -> None:
        self.ctx = ctx
        self.consumer = consumer
        self.ledger = ledger
        self.connect = connect
        self.mode = mode
        self.report = report
        self.active = active
        self.observe = observe
        self.log = logging.getLogger(f"reloadd.consumer.{consumer}.watch")
        self._changed = asyncio.Event()
        self._backoff = Backoff(0.5, 30.0)
        self.stats = stats if stats is not None else {}
        for key in ("lists", "relists", "watches", "events", "drifted"):
            self.stats.setdefault(f"watch_{key}", 0)
        self._reported: set[ObjRef] = set()
        self._reports: set[asyncio.Task[None]] = set()

    def changed(self) -> None:
        """The ledger's members changed: the set of watches is looked at again."""
        self._changed.set()

    def emit(self, path: Path, drift: Drift, ref: ObjRef | None = None) -> None:
        """Hand one drift to the engine (and, in detect mode, report it once per object)."""
        if not self.active():
            return
        self.stats["watch_drifted"] += 1
        self.log.debug("Object drift: %s (declared by %s)", drift, path)
        self.ctx.emit(SourceEvent(EventKind.DRIFTED, path, source=self.name, consumer=self.consumer, drift=drift))
        if self.mode is DriftMode.DETECT and self.report is not None and (ref is None or ref not in self._reported):
            if ref is not None:
                self._reported.add(ref)
            task: asyncio.Task[None] = asyncio.get_running_loop().create_task(self.report(path, drift))
            self._reports.add(task)
            task.add_done_callback(self._reports.discard)

    def forget_reports(self, path: Path) -> None:
        """``path`` was applied again: its objects may be reported again."""
        self._reported = {r for r in self._reported
                          if (m := self.ledger.members.get(r)) is not None and m.path != path}

    async def run(self) -> None:
        """Keep one watch per kind × namespace of the members; raise to be rebuilt by the supervisor."""
        client, discovery = await self.connect()
        tasks: dict[_Target, asyncio.Task[None]] = {}
        try:
            while True:
                self._changed.clear()
                targets = await self._targets(discovery)
                for t in [t for t in tasks if t not in targets]:
                    tasks.pop(t).cancel()
                for t in targets:
                    if t not in tasks:
                        tasks[t] = asyncio.create_task(self._follow(client, t), name=f"reloadd-watch-{t.collection}")
                waiter = asyncio.create_task(self._changed.wait())
                done, _ = await asyncio.wait([waiter, *tasks.values()], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                for task in done:
                    if task is not waiter and not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                await asyncio.sleep(0.2)  # let a burst of applies settle into one look at the targets
        finally:
            for task in tasks.values():
                task.cancel()
            for task in tasks.values():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _targets(self, discovery: Discovery) -> set[_Target]:
        out: set[_Target] = set()
        for group, kind, ns in sorted(self.ledger.kinds()):
            res = await discovery.resolve_group_kind(group, kind)
            if res is None:
                continue  # not served (a CRD removed): nothing to watch until it is
            out.add(_Target(group, kind, ns if res.namespaced else "", res))
        return out

    async def _follow(self, client: KubeClient, t: _Target) -> None:
        """List, then watch and resume, for as long as the target is wanted."""
        rv: str | None = None
        failures = 0
        while True:
            try:
                if rv is None:
                    rv = await self._list(client, t)
                rv = await self._watch(client, t, rv)
                failures = 0
            except _Gone:
                self.stats["watch_relists"] += 1
                self.log.debug("Watch of %s expired (410 Gone): listing again", t.collection)
                rv = None
            except (ApiUnavailable, ApiError) as exc:
                failures += 1
                if isinstance(exc, ApiError):
                    rv = None  # a definite answer (403, 404): start over after the backoff
                delay = self._backoff.delay(failures)
                level = logging.WARNING if failures == 3 else logging.DEBUG
                self.log.log(level, "Watch of %s failed (%d in a row; again in %.1fs): %s",
                             t.collection, failures, delay, exc)
                await asyncio.sleep(delay)  # backoff between reconnects: nothing to await but time

    async def _list(self, client: KubeClient, t: _Target) -> str:
        """List the target's members and judge them (see :func:`list_members`); the list's resourceVersion."""
        self.stats["watch_lists"] += 1
        return await list_members(client, t.resource, t.group, t.kind, t.namespace, self.ledger, self._judge)

    async def _watch(self, client: KubeClient, t: _Target, rv: str) -> str:
        """Watch from ``rv`` until the server ends the stream; the last resourceVersion seen."""
        self.stats["watch_watches"] += 1
        seconds = random.randint(*_TIMEOUT)
        params = {"labelSelector": LABEL_PART_OF, "allowWatchBookmarks": "true", "timeoutSeconds": str(seconds)}
        if rv:
            params["resourceVersion"] = rv
        async for event in client.watch(t.collection, params, read_timeout=seconds + 60):
            kind = event.get("type")
            obj = event.get("object") if isinstance(event.get("object"), Mapping) else {}
            assert isinstance(obj, Mapping)
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise _Gone()
                raise ApiUnavailable(f"WATCH {t.collection}: {obj.get('message') or obj}")
            new_rv = (obj.get("metadata") or {}).get("resourceVersion")
            if new_rv:
                rv = str(new_rv)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self.stats["watch_events"] += 1
                self._judge(str(kind), ref_of(t.group, t.kind, obj), obj)
        return rv

    def _judge(self, kind: str, ref: ObjRef, obj: Mapping[str, Any] | None) -> None:
        if self.observe is not None:
            self.observe(ref, None if kind == "DELETED" else obj)  # health (see ``_health``): the same events
        got = self.ledger.judge(kind, ref, obj)
        if got is not None:
            self.emit(got[0], got[1], ref)
