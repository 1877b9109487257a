"""What the next pass would do to containerd's image store, found reading only (``reloadd plan``).

Tarball: the archive is read without writing anything (``ingest(dry_run=True)``: blobs hashed, docker
manifests synthesised in memory) and its index resolved exactly as an import resolves it, so each image
record an import would create, repoint or relabel is known; compared with the Images service (Get).
List: each valid reference is looked up with CRI ImageStatus; absent ones would be pulled. Release: the
records a changed or deleted file no longer holds, and no other file holds, get ``on_delete`` (unpin or
remove) — listed when that changes an existing record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from reloadd import Batch, ChangeKind, ConsumerError, PathRecord, PermanentError, Plan, PlannedChange, TransientError

from ._client import CRI_NAMESPACE, ContainerdClient
from ._evidence import is_checksum_file, is_evidence
from ._importer import Importer, ImportReport
from ._ingest import ingest
from ._lists import parse_list, read_list
from ._oci import normalize_ref
from ._policy import Policy
from ._settings import Settings
from ._state import state_of

__all__ = ["ImagePlanner"]


@dataclass
class ImagePlanner:
    """Plans one batch of a ``containerd-images`` consumer.

    Attributes:
        client: The consumer's containerd client (only read through).
        settings: Its options.
        importer: Resolves archives as an import does.
        records: The engine's records (what each file holds now).
        labels: The labels a record of a file gets, per file.
        outside: Why a path must not be read (a symlink out of the roots), or "".
        unpin: The labels unpinning removes.
        log: Where refused files are reported.
        policy: The verify policy: what it would refuse is planned invalid, what ``warn`` would let
            through unverified is planned ``unverified``; a file still waiting for evidence is judged as
            the wait's end would judge it.
        shown: A path as refusals show it (``images/web.tar``).
    """

    client: ContainerdClient
    settings: Settings
    importer: Importer
    records: Mapping[Path, PathRecord]
    labels: Callable[[Path], dict[str, str]]
    outside: Callable[[Path], str]
    unpin: tuple[str, ...]
    log: logging.Logger
    policy: Policy
    shown: Callable[[Path, Path | None], str]

    async def plan(self, batch: Batch) -> Plan:
        """Per path: images imported, updated, relabelled, pulled, then what would be released."""
        try:
            await self.client.version()
        except ConsumerError as exc:  # unreachable: fail here, naming the socket
            raise TransientError(f"cannot reach containerd at {self.settings.address}: {exc}") from exc
        out: dict[Path, list[PlannedChange]] = {}
        now: dict[Path, set[str]] = {}
        for change in batch.changes:
            path = change.path
            if is_evidence(path) or is_checksum_file(path):
                out[path] = []  # evidence: what it changes is planned with the files it covers
                continue
            if change.kind is ChangeKind.DELETED:
                now[path], out[path] = set(), []
                continue
            try:
                why = self.outside(path)
                if why:
                    raise PermanentError(why)
                d = await self.policy.decide(path, self.shown(path, change.root), planning=True)
                if d.refused:
                    raise PermanentError(d.refused)
                if path.name.lower().endswith(".txt"):
                    now[path], out[path] = await self._list(path)
                else:
                    now[path], out[path] = await self._tar(path)
                if d.warning:
                    out[path].insert(0, PlannedChange("unverified", str(path), detail={"why": d.warning}))
            except PermanentError as exc:  # the pass rejects the file and keeps what it held: the plan fails
                out[path] = [PlannedChange.invalid(path, str(exc))]
        for path, refs in now.items():
            out[path] += await self._release(path, refs, now)
        return out

    async def _tar(self, path: Path) -> tuple[set[str], list[PlannedChange]]:
        ing = await ingest(self.client, path, "", None, {}, dry_run=True)
        images = await self.importer.images_of(ing, ImportReport())
        wanted = self.importer.record_labels(self.labels(path))
        changes = []
        for image in images:
            fresh, moved, relabelled = [], [], []
            for ref in image.refs:
                current = await self.client.get_image(ref)
                if current is None:
                    fresh.append(ref)
                elif current.target.digest != image.target.digest:
                    moved.append(ref)
                elif any(current.labels.get(k) != v for k, v in wanted.items()):
                    relabelled.append(ref)
            action = "update" if moved else "import" if fresh else "relabel" if relabelled else ""
            if action:
                changes.append(PlannedChange(action, image.name, detail={
                    "digest": image.target.digest, "refs": sorted(fresh + moved + relabelled)}))
        return {r for i in images for r in i.refs}, changes

    async def _list(self, path: Path) -> tuple[set[str], list[PlannedChange]]:
        try:
            text = await read_list(path)
        except ValueError as exc:
            raise PermanentError(str(exc)) from exc
        refs, _invalid = parse_list(text)
        wanted = self.labels(path)
        changes, names = [], set()
        for _, ref in refs:
            name = normalize_ref(ref)
            names.add(name)
            if await self.client.cri_image_id(name) is None:
                changes.append(PlannedChange("pull", name, detail={"refs": [name]}))
                continue
            current = await self.client.get_image(name, namespace=CRI_NAMESPACE)
            if current is not None and any(current.labels.get(k) != v for k, v in wanted.items()):
                changes.append(PlannedChange("relabel", name, detail={"refs": [name]}))
        return names, changes

    async def _release(self, path: Path, refs: set[str], now: Mapping[Path, set[str]]) -> list[PlannedChange]:
        rec = self.records.get(path)
        old = state_of(rec.data) if rec is not None else None
        if old is None or self.settings.on_delete == "keep":
            return []
        held: set[str] = set()
        for p, r in self.records.items():
            st = state_of(r.data)
            if p != path and p not in now and st is not None:
                held |= st.refs
        for p, r2 in now.items():
            if p != path:
                held |= r2
        ns = CRI_NAMESPACE if old.kind == "list" else None
        out = []
        for ref in sorted(old.refs - refs - held):
            current = await self.client.get_image(ref, namespace=ns)
            if current is None:
                continue
            if self.settings.on_delete == "remove":
                out.append(PlannedChange("remove", ref))
            elif any(k in current.labels for k in self.unpin):
                out.append(PlannedChange("unpin", ref))
        return out
