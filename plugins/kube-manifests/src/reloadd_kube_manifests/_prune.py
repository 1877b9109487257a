"""Finding and deleting the members of an ApplySet that are no longer wanted.

Members are found by label (``applyset.kubernetes.io/part-of=<id>``), per group/kind and namespace the
parent lists, exactly as the spec says; an object is deleted only if its label still names this set at
listing time, and the delete carries a ``uid`` precondition so an object re-created meanwhile survives.

A group/kind whose API is unavailable (an aggregated API whose backend is down) cannot be checked: it is
reported as *waiting*, a transient problem, so the caller keeps it in the parent and looks again later
instead of forgetting objects that may still exist.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ._applyset import LABEL_PART_OF, ObjRef
from ._client import ApiError, KubeClient
from ._discovery import Discovery, Resource
from ._ordering import sort_for_delete

__all__ = ["Member", "Scan", "delete_members", "inventory_members", "list_members"]


@dataclass(frozen=True, slots=True)
class Member:
    """A live object labelled as part of the set."""

    ref: ObjRef
    uid: str
    resource: Resource


@dataclass
class Scan:
    """What looking for a set's members found.

    Attributes:
        members: The live members.
        notes: Group/kinds the server no longer serves (skipped: their objects are gone with them).
        errors: Listings or reads the server refused (e.g. 403); those objects could not be checked.
        waiting: Group/kinds whose API is unavailable right now; check again later.
    """

    members: list[Member] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)


async def list_members(
    client: KubeClient,
    discovery: Discovery,
    set_id: str,
    group_kinds: Iterable[str],
    namespaces: Iterable[str],
) -> Scan:
    """Live members of ``set_id`` over ``group_kinds`` × ``namespaces``."""
    scan = Scan()
    notes, errors = scan.notes, scan.errors
    queries: list[tuple[Resource, str | None]] = []
    for gk in sorted(set(group_kinds)):
        group, kind = Discovery.parse_group_kind(gk)
        res = await discovery.resolve_group_kind(group, kind)
        if res is None:
            why = discovery.group_problem(group)
            if why is not None:
                scan.waiting.append(f"prune: cannot check {gk} objects: {why}")
            else:
                notes.append(f"{gk} is not served; its objects were not checked")
            continue
        if res.namespaced:
            queries.extend((res, ns) for ns in sorted(set(namespaces)))
        else:
            queries.append((res, None))

    async def one(res: Resource, ns: str | None) -> list[Member]:
        selector = {"labelSelector": f"{LABEL_PART_OF}={set_id}"}
        try:
            try:
                body = await client.get(res.path(ns), selector)
            except ApiError as exc:
                if not exc.not_served:
                    raise
                # Discovery was stale: the kind went away (its CRD was deleted) or moved version.
                now = await discovery.reread(res)
                if now is None:
                    notes.append(f"{res.group_kind} is not served any more; its objects went with it")
                    return []
                body = await client.get(now.path(ns), selector)
                res = now
        except ApiError as exc:
            errors.append(f"prune: cannot list {res.group_kind}{' in ' + ns if ns else ''}: {exc}")
            return []
        found = []
        for item in body.get("items") or ():
            meta: dict[str, Any] = item.get("metadata") or {}
            if (meta.get("labels") or {}).get(LABEL_PART_OF) != set_id:
                continue  # never touch what another set (or nobody) owns
            ref = ObjRef(res.group, res.kind, str(meta.get("namespace") or ""), str(meta.get("name")))
            found.append(Member(ref, str(meta.get("uid") or ""), res))
        return found

    results = await asyncio.gather(*(one(res, ns) for res, ns in queries))
    scan.members = [m for chunk in results for m in chunk]
    return scan


async def inventory_members(
    client: KubeClient, discovery: Discovery, set_id: str, refs: Iterable[ObjRef]
) -> Scan:
    """The objects of ``refs`` that exist and still carry ``set_id``'s label (one GET each).

    The cheap path for a changed file: the parent's inventory names every object the set may hold
    (it is widened before anything is applied), so only those that left the file need a look.
    """
    scan = Scan()
    errors = scan.errors

    async def one(ref: ObjRef) -> Member | None:
        res = await discovery.resolve_group_kind(ref.group, ref.kind)
        if res is None:
            why = discovery.group_problem(ref.group)
            if why is not None:
                scan.waiting.append(f"prune: cannot check {ref}: {why}")
            return None  # else the kind is gone, and its objects with it
        try:
            obj = await client.get(res.path(ref.namespace or None, ref.name))
        except ApiError as exc:
            if exc.status != 404:
                errors.append(f"prune: cannot read {ref}: {exc}")
            return None
        meta: dict[str, Any] = obj.get("metadata") or {}
        if (meta.get("labels") or {}).get(LABEL_PART_OF) != set_id:
            return None  # moved to another set (a renamed file) or relabelled by hand
        return Member(ref, str(meta.get("uid") or ""), res)

    found = await asyncio.gather(*(one(r) for r in sorted(set(refs))))
    scan.members = [m for m in found if m is not None]
    return scan


async def delete_members(
    client: KubeClient, members: Iterable[Member], *, dry_run: bool
) -> tuple[list[ObjRef], list[str]]:
    """Delete ``members`` in reverse apply order.

    Returns:
        The references deleted, and error messages for those that could not be.
    """
    deleted: list[ObjRef] = []
    errors: list[str] = []
    for m in sort_for_delete(members, lambda m: (m.ref.group, m.ref.kind)):
        try:
            await client.delete(m.resource.path(m.ref.namespace or None, m.ref.name), uid=m.uid,
                                dry_run=dry_run)
        except ApiError as exc:
            if exc.status == 409:
                continue  # uid precondition failed: re-created by someone else meanwhile
            errors.append(f"prune {m.ref}: {exc}")
            continue
        deleted.append(m.ref)
    return deleted, errors
