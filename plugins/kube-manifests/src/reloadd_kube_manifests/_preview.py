"""What applying or removing one file would change, found without changing anything (``reloadd plan``).

Apply: each object is server-side applied with ``dryRun=All`` (same body, field manager and ``force`` as the
real apply) and the answer is compared with the live object, ignoring what every write moves
(``managedFields``, ``resourceVersion``, ``generation``, timestamps), as ``kubectl diff`` does. The members
that left the file (parent inventory, still labelled with the set) are what would be pruned. Remove: every
live member of the set, found by label. Objects another file of the batch declares are never listed as
pruned, as the real pass keeps them (see ``_claims``). The ApplySet parent ConfigMap is bookkeeping and
is not listed.
"""

from __future__ import annotations

import asyncio
import difflib
import json
from collections.abc import Collection, Mapping
from typing import Any

from reloadd import PlannedChange

from ._apply import Applier, _Planned
from ._applyset import ObjRef, applyset_id, parent_name
from ._client import ApiError
from ._manifests import Manifest
from ._outcome import FileOutcome
from ._prune import Member, inventory_members, list_members

__all__ = ["declared_refs", "normalized", "preview_apply", "preview_remove"]

_VOLATILE_META = ("managedFields", "resourceVersion", "generation", "creationTimestamp", "uid", "selfLink")


def normalized(obj: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``obj`` without the fields every write (or a dry-run create) moves."""
    if obj is None:
        return None
    out: dict[str, Any] = json.loads(json.dumps(obj))
    meta = out.get("metadata") or {}
    for key in _VOLATILE_META:
        meta.pop(key, None)
    annotations = meta.get("annotations") or {}
    annotations.pop("kubectl.kubernetes.io/last-applied-configuration", None)
    if not annotations:
        meta.pop("annotations", None)
    return out


def _text(obj: Mapping[str, Any] | None) -> list[str]:
    return [] if obj is None else (json.dumps(obj, indent=2, sort_keys=True) + "\n").splitlines(keepends=True)


def _diff(label: str, live: Mapping[str, Any] | None, dry: Mapping[str, Any] | None) -> str:
    return "".join(difflib.unified_diff(_text(live), _text(dry), f"{label} (live)" if live else "/dev/null",
                                        f"{label} (dry-run)" if dry else "/dev/null"))


def _label(ref: ObjRef) -> str:
    return f"{ref.kind} {ref.namespace}/{ref.name}" if ref.namespace else f"{ref.kind} {ref.name}"


def _pruned(members: list[Member], keep: Collection[ObjRef]) -> list[PlannedChange]:
    return [PlannedChange("prune", _label(m.ref), detail={"object": str(m.ref)})
            for m in sorted(members, key=lambda m: m.ref) if m.ref not in keep]


async def _object(applier: Applier, plan: _Planned, set_id: str, out: FileOutcome) -> PlannedChange | None:
    res = plan.resource
    label = _label(plan.ref)
    if res is None:  # a kind this very file's CRD brings: nothing to dry-run against yet
        return PlannedChange("create", label, detail={"object": str(plan.ref), "note": "kind not served yet"})
    path = res.path(plan.ref.namespace or None, plan.ref.name)
    try:
        live = await applier.client.get(path)
    except ApiError as exc:
        if exc.status != 404:
            raise
        live = None
    try:
        dry = await applier.client.apply(path, applier._body(plan, res, set_id), manager=applier.settings.field_manager,
                                         force=applier.settings.force, dry_run=True)
    except ApiError as exc:
        out.errors.append(f"{plan.label}: {exc}")  # the real apply fails the same way: nothing changes
        return None
    before, after = normalized(live), normalized(dry)
    if before == after:
        return None
    return PlannedChange("create" if live is None else "update", label, _diff(label, before, after),
                         {"object": str(plan.ref)})


async def declared_refs(applier: Applier, manifest: Manifest) -> set[ObjRef]:
    """The objects ``manifest`` declares (kinds resolved as the apply resolves them)."""
    return {p.ref for p in await applier._plan(manifest, FileOutcome("", ""))}


async def preview_apply(
    applier: Applier, key: str, manifest: Manifest, keep: Collection[ObjRef] = ()
) -> tuple[list[PlannedChange], FileOutcome]:
    """What :meth:`Applier.apply_file` would change for ``manifest``; the outcome carries refused objects.

    Raises:
        ApiError: when the parent cannot be read (e.g. 403).
        ApiUnavailable: when the server stays unreachable.
    """
    name = parent_name(key)
    set_id = applyset_id(name, applier.settings.namespace)
    out = FileOutcome(f"{applier.settings.namespace}/{name}", set_id, manifest.sha256)
    out.errors.extend(str(e) for e in manifest.errors)
    old, _ = await applier._read_parent(name)
    plans = await applier._plan(manifest, out)
    out.desired = {p.ref for p in plans}
    found = await asyncio.gather(*(_object(applier, p, set_id, out) for p in plans))
    changes = [c for c in found if c is not None]
    if applier.settings.prune and not manifest.errors:
        scan = await inventory_members(applier.client, applier.discovery, set_id, old.inventory - out.desired)
        out.errors.extend(scan.errors)
        changes += _pruned(scan.members, set(keep) | out.desired)
    return changes, out


async def preview_remove(applier: Applier, key: str, keep: Collection[ObjRef] = ()) -> list[PlannedChange]:
    """What :meth:`Applier.remove_file` would delete: the set's live members not in ``keep``.

    Raises:
        ApiError: when the parent cannot be read (e.g. 403).
        ApiUnavailable: when the server stays unreachable.
    """
    name = parent_name(key)
    state, _ = await applier._read_parent(name)
    if not applier.settings.prune or not state.group_kinds:
        return []
    set_id = applyset_id(name, applier.settings.namespace)
    scan = await list_members(applier.client, applier.discovery, set_id, state.group_kinds, state.namespaces)
    return _pruned(scan.members, keep)
