"""``reloadd plan``: a dry run of what a pass would apply, prune and reject, per file.

A part of :class:`~reloadd_kube_manifests.KubeManifestsConsumer` (see ``_parts``); the previews are
``_preview``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from reloadd import Batch, Change, ChangeKind, Plan, PlannedChange, ReloaddError

from .._applyset import ObjRef
from .._gate import WaveError, wave_of
from .._manifests import Manifest, load_manifest
from .._preview import declared_refs, preview_apply, preview_remove
from .base import SKIP_SUFFIX, ConsumerBase, _marked

__all__ = ["PlanPart"]


class PlanPart(ConsumerBase):
    """Plans a batch without writing: every apply carries ``dryRun=All`` and deletes are only listed."""

    async def plan(self, batch: Batch) -> Plan:
        """Dry-run what :meth:`handle` would do: per file, objects created/updated (with a diff) and pruned.

        A ``.skip`` marker stands for its file (the real pass hands that file over next). A file whose
        content the pass would skip (same SHA-256 as last applied) or cannot read plans nothing. Objects
        another file of the batch declares are not listed as pruned, as :meth:`handle` keeps them.
        Nothing is written: every apply carries ``dryRun=All`` and deletes are only listed.
        """
        if self.applier is None:
            await self._connect(elect=False)  # planning reads: no election
        applier = await self._ready()
        paths: dict[Path, Change] = {}
        for c in batch.changes:
            target = c.path.with_suffix("") if c.path.suffix.lower() == SKIP_SUFFIX else c.path
            if target.exists() or target in self.ctx.records:
                paths.setdefault(target, c if target == c.path else Change(target, ChangeKind.MODIFIED, None))
        removals = [p for p in paths if not p.exists() or _marked(p)]
        manifests: dict[Path, Manifest] = {}
        refused: dict[Path, list[PlannedChange]] = {}
        for path, change in paths.items():
            if path in removals or self._unchanged(change):
                continue
            try:
                manifests[path] = await load_manifest(path, max_bytes=self.settings.max_file_size)
            except ReloaddError as exc:  # the next pass rejects it: the plan fails, naming it
                refused[path] = [PlannedChange.invalid(path, str(exc))]
                continue
            if manifests[path].errors:  # documents the pass cannot read: it applies the rest and rejects the file
                refused[path] = [PlannedChange.invalid(path, "; ".join(map(str, manifests[path].errors)))]
        declared = {path: await declared_refs(applier, m) for path, m in manifests.items()}
        claimed: set[ObjRef] = set().union(*declared.values())
        planned: dict[Path, list[PlannedChange]] = {}
        for path, manifest in manifests.items():
            others: set[ObjRef] = set().union(*(refs for p, refs in declared.items() if p != path))
            planned[path], out = await preview_apply(applier, self.key(path), manifest, keep=others)
            for problem in out.problems():
                self.log.warning("The next pass cannot apply all of %s: %s", path, problem)
        for path in removals:
            planned[path] = await preview_remove(applier, self.key(path), keep=claimed)
        self._plan_waves(manifests, planned, refused)
        return {p: [*planned.get(p, ()), *refused.get(p, ())] for p in {**planned, **refused}}

    @staticmethod
    def _plan_waves(manifests: Mapping[Path, Manifest], planned: dict[Path, list[PlannedChange]],
                    refused: dict[Path, list[PlannedChange]]) -> None:
        """With waves in use, each planned file says its wave first (``wave 1 of 0, 1: ...``)."""
        waves: dict[Path, int] = {}
        for path, manifest in manifests.items():
            try:
                waves[path] = wave_of(manifest)
            except WaveError as exc:
                refused.setdefault(path, []).append(PlannedChange.invalid(path, str(exc)))
        used = sorted(set(waves.values()))
        if used == [0] or not used:
            return
        for path, wave in waves.items():
            earlier = [w for w in used if w < wave]
            when = (f"applied once every object of wave {', '.join(map(str, earlier))} is current"
                    if earlier else "applied first")
            planned.setdefault(path, []).insert(0, PlannedChange(
                "wave", f"{wave} of {', '.join(map(str, used))}: {when}", detail={"wave": wave}))
