"""Applying one manifest file as one ApplySet, and removing it.

Apply, for one file::

    parent as known (``_parents``: listed once, then from write answers) → resolve kinds
    → widen parent (old ∪ new group/kinds, namespaces; only when it does not hold them already)
    → server-side apply by rank (CRDs; wait Established + rediscover; Namespaces; ...; the rest)
    → prune members that left the file → write parent (new sets, content hash, inventory; no request
      when the widening already said it)

A parent that changed on the server since it was known (a precondition failed) starts the file again from a
fresh read, once; objects are applied idempotently, so the second try only costs requests.

Error policy (per object, the rest of the file is still applied): a document that cannot be parsed, or an
object the server refuses (409 conflict with ``force`` off, 422, 403, 500 schema errors, a request that
drops the connection again and again) is a *permanent* error of the file; overload, a namespace or custom
kind that does not exist yet, an aggregated API that is unavailable are *transient*. While any
document of the file could not be parsed, pruning is held back: the broken document's objects are unknown,
so deleting "everything not in the file" could delete objects the user still wants.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from reloadd import Backoff

from ._applyset import LABEL_PART_OF, ObjRef, ParentState, applyset_id, parent_name
from ._claims import Claims
from ._client import ApiError, ApiUnavailable, KubeClient
from ._discovery import Discovery, Resource, split_api_version
from ._manifests import Manifest, ManifestObject
from ._ordering import rank
from ._outcome import FileOutcome
from ._parents import ParentMoved, Parents
from ._prune import Scan, delete_members, inventory_members, list_members
from ._settings import Settings

__all__ = ["Applier"]

_CRD_GROUP = "apiextensions.k8s.io"
_CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"


@dataclass
class _Planned:
    obj: ManifestObject
    ref: ObjRef
    resource: Resource | None
    from_crd: bool = False

    @property
    def label(self) -> str:
        ns = f"{self.ref.namespace}/" if self.ref.namespace else ""
        return f"{self.obj.where} {self.obj.kind} {ns}{self.ref.name}"


def _established(crd: Mapping[str, Any]) -> bool:
    """Whether a CustomResourceDefinition's status says Established."""
    return any(
        c.get("type") == "Established" and c.get("status") == "True"
        for c in (crd.get("status") or {}).get("conditions") or ()
        if isinstance(c, Mapping)
    )


class Applier:
    """Applies files to one cluster.

    Args:
        client: The REST client.
        discovery: The discovery cache.
        settings: Validated options.
        default_namespace: Namespace for namespaced objects that name none.
        tooling: The ApplySet ``tooling`` annotation, ``reloadd/<version>``.
        logger: Where to log.
        sleep: Injectable for tests.

    Attributes:
        claims: What each file wants, shared by concurrent batches (see ``_claims``).
    """

    def __init__(
        self,
        client: KubeClient,
        discovery: Discovery,
        settings: Settings,
        *,
        default_namespace: str = "default",
        tooling: str = "reloadd/0.1.0",
        logger: logging.Logger | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.client = client
        self.discovery = discovery
        self.settings = settings
        self.default_namespace = default_namespace
        self.tooling = tooling
        self.log = logger or logging.getLogger(__name__)
        self._sleep = sleep
        self._sem = asyncio.Semaphore(settings.parallel)
        self.claims = Claims()
        self.parents = Parents(client, settings.namespace, manager=settings.field_manager, tooling=tooling,
                               dry_run=settings.dry_run)

    # --- parent --------------------------------------------------------------------------------------
    async def _read_parent(self, name: str) -> tuple[ParentState, str]:
        """GET the parent (always a request: removal and moves act on what the server holds now)."""
        return await self.parents.read(name)

    # --- planning ------------------------------------------------------------------------------------
    async def _plan(self, manifest: Manifest, out: FileOutcome) -> list[_Planned]:
        crd_kinds: dict[tuple[str, str], bool] = {}  # (group, kind) → namespaced, for CRDs in this file
        for obj in manifest.objects:
            if obj.kind == "CustomResourceDefinition" and split_api_version(obj.api_version)[0] == _CRD_GROUP:
                spec = obj.body.get("spec") or {}
                kind = (spec.get("names") or {}).get("kind")
                if spec.get("group") and kind:
                    crd_kinds[(str(spec["group"]), str(kind))] = spec.get("scope") != "Cluster"
        plans: list[_Planned] = []
        seen: dict[ObjRef, ManifestObject] = {}
        for obj in manifest.objects:
            group, _version = split_api_version(obj.api_version)
            res = await self.discovery.resolve(obj.api_version, obj.kind)
            if res is not None:
                namespaced = res.namespaced
            else:
                namespaced = crd_kinds.get((group, obj.kind), obj.namespace is not None)
            ns = (obj.namespace or self.default_namespace) if namespaced else ""
            ref = ObjRef(group, obj.kind, ns, obj.name)
            if ref in seen:
                out.errors.append(f"{obj.where}: {ref} is also defined by {seen[ref].where}; ignored")
                continue
            seen[ref] = obj
            plans.append(_Planned(obj, ref, res, from_crd=(group, obj.kind) in crd_kinds))
        return plans

    # --- applying ------------------------------------------------------------------------------------
    def _body(self, plan: _Planned, res: Resource, set_id: str) -> dict[str, Any]:
        # The manifest's object stays as read: only the top level and its metadata are copied, the two dicts
        # changed here (the rest is shared, and only serialised); a JSON round trip per object copied it all.
        body: dict[str, Any] = dict(plan.obj.body)
        meta = body["metadata"] = dict(body["metadata"])
        meta["labels"] = {**(meta.get("labels") or {}), LABEL_PART_OF: set_id}
        if res.namespaced:
            meta["namespace"] = plan.ref.namespace
        else:
            meta.pop("namespace", None)
        return body

    async def _wait_served(self, plan: _Planned) -> Resource | None:
        """Resolve a kind a CRD of this file provides, rediscovering until served or timed out."""
        deadline = time.monotonic() + self.settings.crd_timeout
        backoff = Backoff(0.05, 0.5, jitter=False)
        for attempt in itertools.count(1):
            self.discovery.invalidate(plan.ref.group)
            res = await self.discovery.resolve(plan.obj.api_version, plan.obj.kind)
            if res is not None or time.monotonic() >= deadline:
                return res
            await self._sleep(backoff.delay(attempt))
        return None  # pragma: no cover - the loop only returns

    async def _wait_established(self, name: str) -> bool:
        deadline = time.monotonic() + self.settings.crd_timeout
        backoff = Backoff(0.02, 0.5, jitter=False)
        for attempt in itertools.count(1):
            if _established(await self.client.get(_CRD_PATH + name)):
                return True
            if time.monotonic() >= deadline:
                return False
            await self._sleep(backoff.delay(attempt))
        return False  # pragma: no cover - the loop only returns

    async def _apply_one(
        self, plan: _Planned, set_id: str, out: FileOutcome, established: set[str] | None = None
    ) -> bool:
        """Apply one object; ``established`` collects CRDs whose apply answer already says Established."""
        async with self._sem:
            res = plan.resource
            unavailable = self.discovery.problem(plan.obj.api_version)
            if res is None and plan.from_crd and not self.settings.dry_run:
                res = await self._wait_served(plan)
            elif res is None and unavailable is None:
                self.discovery.invalidate(plan.ref.group)
                res = await self.discovery.resolve(plan.obj.api_version, plan.obj.kind)
                unavailable = self.discovery.problem(plan.obj.api_version)
            if res is None:
                if unavailable is not None:
                    out.transient.append(f"{plan.label}: waiting for its API: {unavailable}")
                    return False
                why = "its CRD is not applied" if self.settings.dry_run and plan.from_crd else "unknown kind"
                out.transient.append(
                    f"{plan.label}: {why}: {plan.obj.kind} is not served in {plan.obj.api_version}"
                )
                return False
            warnings: list[str] = []
            for attempt in (1, 2):
                try:
                    answer = await self.client.apply(
                        res.path(plan.ref.namespace or None, plan.ref.name), self._body(plan, res, set_id),
                        manager=self.settings.field_manager, force=self.settings.force,
                        dry_run=self.settings.dry_run, warnings=warnings,
                    )
                except ApiUnavailable as exc:
                    out.transient.append(f"{plan.label}: {exc}")
                    return False
                except ApiError as exc:
                    if exc.not_served and attempt == 1:
                        self.discovery.invalidate(plan.ref.group)  # stale cache: the kind went away
                        again = await self.discovery.resolve(plan.obj.api_version, plan.obj.kind)
                        if again is not None:
                            res = again
                            continue
                    self._record_error(plan, exc, out)
                    return False
                out.applied += 1
                if isinstance(answer, dict) and not self.settings.dry_run:
                    out.answers[plan.ref] = answer
                out.warnings.extend(f"{plan.label}: {w}" for w in warnings)
                if established is not None and isinstance(answer, dict) and _established(answer):
                    established.add(plan.ref.name)  # an unchanged CRD: no need to poll for it
                return True
            return False  # pragma: no cover - the loop always returns

    def _record_error(self, plan: _Planned, exc: ApiError, out: FileOutcome) -> None:
        if exc.field_conflict:
            fields = ", ".join(str(c.get("field")) for c in exc.causes if isinstance(c, dict))
            out.errors.append(
                f"{plan.label}: conflict with another field manager on {fields} ({exc.message}); "
                "set force = true to take the fields over"
            )
        elif exc.status == 404 or (exc.status == 409 and not exc.causes):
            out.transient.append(f"{plan.label}: {exc}")  # namespace or kind not there yet; a race
        else:
            out.errors.append(f"{plan.label}: {exc}")

    async def _apply_all(self, plans: list[_Planned], set_id: str, out: FileOutcome) -> None:
        ranks = sorted({rank(p.ref.group, p.ref.kind) for p in plans})
        for r in ranks:
            group = [p for p in plans if rank(p.ref.group, p.ref.kind) == r]
            established: set[str] = set()
            oks = await asyncio.gather(*(self._apply_one(p, set_id, out, established) for p in group))
            crds = [p for p, ok in zip(group, oks, strict=True)
                    if ok and p.ref.kind == "CustomResourceDefinition" and p.ref.group == _CRD_GROUP]
            if crds and not self.settings.dry_run:
                for p in crds:
                    if p.ref.name not in established and not await self._wait_established(p.ref.name):
                        out.transient.append(f"{p.label}: not Established after {self.settings.crd_timeout}s")
                    spec = p.obj.body.get("spec") or {}
                    self.discovery.invalidate(str(spec.get("group") or ""))

    # --- entry points --------------------------------------------------------------------------------
    async def apply_file(
        self, key: str, source: str, manifest: Manifest, *, thorough: bool = False
    ) -> FileOutcome:
        """Apply ``manifest`` (read from ``source``) as the ApplySet of ``key`` and prune what left it.

        Pruning looks at the parent's inventory (one GET per object that left the file); with
        ``thorough`` (forced passes) it lists every group/kind × namespace by label, as the spec does,
        which also finds members the inventory missed.

        Raises:
            ApiError: when the parent itself cannot be read or written (e.g. 403).
            ApiUnavailable: when the server stays unreachable.
        """
        pruned: list[str] = []
        for attempt in (1, 2):
            try:
                return await self._apply_file(key, source, manifest, thorough, pruned)
            except ParentMoved as exc:
                if attempt == 2:
                    raise ApiUnavailable(f"the ApplySet parent keeps changing: {exc}", str(exc)) from exc
                self.log.info("Re-reading the ApplySet parent of %s: %s", source, exc)
                await self.parents.read(parent_name(key))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _apply_file(
        self, key: str, source: str, manifest: Manifest, thorough: bool, pruned: list[str]
    ) -> FileOutcome:
        """One try of :meth:`apply_file`; ``pruned`` carries what an earlier try deleted (:class:`ParentMoved`)."""
        name = parent_name(key)
        set_id = applyset_id(name, self.settings.namespace)
        out = FileOutcome(f"{self.settings.namespace}/{name}", set_id, manifest.sha256)
        out.pruned = pruned
        out.errors.extend(str(e) for e in manifest.errors)
        out.unreadable = len(manifest.errors)
        old = await self.parents.state(name)
        plans = await self._plan(manifest, out)
        desired = out.desired = {p.ref for p in plans}
        await self.claims.want(key, desired)  # before anything is relabelled: no other file deletes these now
        new_gks = {r.group_kind for r in desired}
        new_nss = {r.namespace for r in desired if r.namespace}
        if not old.exists or not (
            new_gks <= old.group_kinds and new_nss <= old.namespaces and desired <= old.inventory
        ):
            # The new content's hash already: when nothing is left to prune, the final write has nothing to add.
            await self.parents.write(name, old.group_kinds | new_gks, old.namespaces | new_nss, source,
                                     manifest.sha256, old.inventory | desired, key)
        await self._apply_all(plans, set_id, out)
        final_gks, final_nss = old.group_kinds | new_gks, old.namespaces | new_nss
        final_inventory = old.inventory | desired  # until pruning proves the rest gone
        if not self.settings.prune:
            final_gks, final_nss, final_inventory = new_gks, new_nss, desired  # the rest is let go
        elif manifest.errors:
            out.pruning_held = "the file has documents that could not be read"
        else:
            scan: Scan
            if thorough:
                scan = await list_members(self.client, self.discovery, set_id, final_gks, final_nss)
                for note in scan.notes:
                    self.log.info("Pruning %s: %s", source, note)
            else:
                scan = await inventory_members(self.client, self.discovery, set_id, old.inventory - desired)
            leaving = [m for m in scan.members if m.ref not in desired]
            with self.claims.deleting(key, leaving, lambda m: m.ref) as doomed:
                deleted, delete_errors = await delete_members(self.client, doomed, dry_run=self.settings.dry_run)
            out.pruned.extend(str(r) for r in deleted)
            errors = scan.errors + delete_errors
            out.errors.extend(errors)
            out.transient.extend(scan.waiting)  # kept in the parent below, looked at again on the retry
            if not errors and not scan.waiting:
                final_gks, final_nss, final_inventory = new_gks, new_nss, desired
        await self.parents.write(name, final_gks, final_nss, source, manifest.sha256, final_inventory, key)
        return out

    async def members(self, key: str) -> set[ObjRef]:
        """The objects the ApplySet of ``key`` may hold, from its parent's inventory (empty without a parent).

        Raises:
            ApiError: when the parent cannot be read (e.g. 403).
            ApiUnavailable: when the server stays unreachable.
        """
        state, _uid = await self._read_parent(parent_name(key))
        return state.inventory

    async def remove_file(self, key: str, keep: Collection[ObjRef] = ()) -> FileOutcome:
        """Delete everything the ApplySet of ``key`` holds (found by label), then its parent.

        Objects another file wants (the target of a rename whose relabelling failed for some object, or
        a file that declares the same object) and objects in ``keep`` are left alone.
        """
        self.claims.forget(key)
        name = parent_name(key)
        set_id = applyset_id(name, self.settings.namespace)
        out = FileOutcome(f"{self.settings.namespace}/{name}", set_id)
        state, uid = await self._read_parent(name)
        if self.settings.prune and state.group_kinds:
            scan = await list_members(self.client, self.discovery, set_id, state.group_kinds, state.namespaces)
            for note in scan.notes:
                self.log.info("Removing the objects of %s: %s", key, note)
            with self.claims.deleting(key, scan.members, lambda m: m.ref, keep) as doomed:
                deleted, errors = await delete_members(self.client, doomed, dry_run=self.settings.dry_run)
            out.pruned.extend(str(r) for r in deleted)
            errors = scan.errors + errors
            out.errors.extend(errors)
            out.transient.extend(scan.waiting)
            if errors or scan.waiting:
                return out  # keep the parent: it is how a later pass finds the leftovers
        if uid:
            await self.client.delete(self.parents.path(name), uid=uid, dry_run=self.settings.dry_run)
            self.parents.forget(name, gone=True)
        return out
