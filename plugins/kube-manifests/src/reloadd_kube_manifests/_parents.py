"""The ApplySet parents of one consumer as the server holds them: read once, then known from the answers.

Before this book every apply of a file cost three requests on its parent ConfigMap: a GET, a write that
widens it (the spec wants the superset recorded *before* the members are applied) and a final write. The
folder's first pass of 100 files of 10 objects sent 1,300 requests where 1,000 do the work. Now:

* the parents are listed once, on the first need (one LIST of the namespace's ConfigMaps that reloadd
  manages), and each write's answer replaces what is known: no GET before an apply;
* a parent the server already holds exactly is not written again (the first pass writes each parent once:
  the widening write already says what the final one would);
* exactness does not rest on the cache. A parent known to be absent is *created* (POST: ``409
  AlreadyExists`` if someone made it meanwhile); a known parent is written with its ``resourceVersion`` as
  a precondition (``409 Conflict`` if it changed since). Either way :class:`ParentMoved` is raised, the
  entry is forgotten, and the caller starts the file again from a fresh GET, so a parent is never
  narrowed from a stale copy.

A dry run bypasses the book: every read is a GET and every write is sent (``dryRun=All``), as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ._applyset import LABEL_MANAGED_BY, ObjRef, ParentState, parent_body, read_parent
from ._client import ApiError, ApiUnavailable, KubeClient

__all__ = ["ParentMoved", "Parents"]


class ParentMoved(Exception):
    """A parent changed on the server since it was read (or appeared where none was): read it again."""


@dataclass(frozen=True, slots=True)
class _Known:
    """A parent as last read or written: decoded, its ``uid``, ``resourceVersion`` and raw fields."""

    state: ParentState
    uid: str
    rv: str
    obj: Mapping[str, Any]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _holds(obj: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """Whether the parent ``obj`` already holds every label, annotation and exactly the data of ``body``."""
    have, want = _meta(obj), _meta(body)
    for part in ("labels", "annotations"):
        got = have.get(part) or {}
        if any(got.get(k) != v for k, v in (want.get(part) or {}).items()):
            return False
    return (obj.get("data") or {}) == (body.get("data") or {})


class Parents:
    """What the server holds of each parent ConfigMap in ``namespace``, kept from reads and write answers.

    Args:
        client: The REST client.
        namespace: Where the parents live.
        manager: The server-side-apply field manager.
        tooling: The ApplySet ``tooling`` annotation.
        dry_run: Writes are dry runs: nothing is remembered, nothing skipped.
    """

    def __init__(self, client: KubeClient, namespace: str, *, manager: str, tooling: str, dry_run: bool) -> None:
        self.client = client
        self.namespace = namespace
        self.manager = manager
        self.tooling = tooling
        self.dry_run = dry_run
        self._known: dict[str, _Known | None] = {}  # None: known to be absent
        self._unsure: set[str] = set()  # forgotten since the list: read before use
        self._listed = False
        self._refused = False  # the LIST was refused: never asked again
        self._lock = asyncio.Lock()

    def path(self, name: str = "") -> str:
        """The URL of parent ``name`` (of the collection without one)."""
        base = f"/api/v1/namespaces/{self.namespace}/configmaps"
        return f"{base}/{name}" if name else base

    def _remember(self, name: str, obj: Mapping[str, Any] | None) -> None:
        if self.dry_run:
            return
        self._unsure.discard(name)
        if not obj:
            self._known[name] = None
            return
        meta = _meta(obj)
        self._known[name] = _Known(read_parent(obj, self.namespace), str(meta.get("uid") or ""),
                                   str(meta.get("resourceVersion") or ""), obj)

    def forget(self, name: str, *, gone: bool = False) -> None:
        """Drop what is known of ``name`` (``gone``: it was just deleted, so it is known to be absent)."""
        if gone and not self.dry_run:
            self._remember(name, None)
        else:
            self._known.pop(name, None)
            self._unsure.add(name)

    async def read(self, name: str) -> tuple[ParentState, str]:
        """GET the parent (exact, always a request); its state and ``uid`` (``""`` when absent).

        Raises:
            ApiError: when it cannot be read (e.g. 403).
            ApiUnavailable: when the server stays unreachable.
        """
        try:
            obj = await self.client.get(self.path(name))
        except ApiError as exc:
            if exc.status != 404 or exc.plain:
                raise
            obj = None
        self._remember(name, obj)
        uid = str(_meta(obj or {}).get("uid") or "")
        return read_parent(obj, self.namespace), uid

    async def _list(self) -> None:
        """List the parents once; a refusal (403) or failure leaves the book to GET each one instead."""
        async with self._lock:
            if self._listed:
                return
            try:
                answer = await self.client.get(self.path(), {"labelSelector": f"{LABEL_MANAGED_BY}=reloadd"})
            except ApiError:
                self._refused = True  # e.g. a role without `list`: GET each parent from now on
                return
            except ApiUnavailable:
                return
            for item in (answer or {}).get("items") or ():
                if isinstance(item, Mapping) and _meta(item).get("name"):
                    self._remember(str(_meta(item)["name"]), item)
            self._listed = True

    async def state(self, name: str) -> ParentState:
        """The parent's state as known (listed, or from the last answer), else read.

        Raises:
            ApiError: when it cannot be read (e.g. 403).
            ApiUnavailable: when the server stays unreachable.
        """
        if not self.dry_run and not self._listed and not self._refused:
            await self._list()
        if not self.dry_run and name in self._known:
            known = self._known[name]
            return known.state if known is not None else ParentState()
        if not self.dry_run and self._listed and name not in self._unsure:
            self._known[name] = None  # not listed, not written since: absent (a create proves it)
            return ParentState()
        return (await self.read(name))[0]

    async def write(
        self, name: str, gks: set[str], nss: set[str], source: str, sha: str, inventory: Iterable[ObjRef], key: str
    ) -> None:
        """Make the parent say this; no request when it already does.

        Raises:
            ParentMoved: it changed on the server since it was known (forgotten: read it again).
            ApiError: when it cannot be written (e.g. 403).
            ApiUnavailable: when the server stays unreachable.
        """
        body = parent_body(name, self.namespace, tooling=self.tooling, group_kinds=gks, namespaces=nss,
                           source=source, sha256=sha, inventory=inventory, key=key)
        if self.dry_run:
            await self.client.apply(self.path(name), body, manager=self.manager, force=True, dry_run=True)
            return
        absent = name in self._known and self._known[name] is None
        known = self._known.get(name)
        if known is not None and _holds(known.obj, body):
            return
        try:
            if absent:
                answer = await self.client.request("POST", self.path(), params={"fieldManager": self.manager},
                                                   body=body)
            else:
                if known is not None:
                    body["metadata"]["resourceVersion"] = known.rv
                answer = await self.client.apply(self.path(name), body, manager=self.manager, force=True,
                                                 dry_run=False)
        except ApiError as exc:
            if (exc.status == 409 and not exc.field_conflict) or (exc.status == 404 and not exc.plain):
                self.forget(name)
                raise ParentMoved(f"{self.namespace}/{name}: {exc}") from exc
            raise
        if isinstance(answer, Mapping):
            self._remember(name, answer)
        else:
            self.forget(name)
