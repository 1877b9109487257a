"""Health tracking glue: the report, and a file failing or recovering told (log line, Event, the core).

A part of :class:`~reloadd_kube_manifests.KubeManifestsConsumer` (see ``_parts``); the book itself (objects
by health, files not current) is ``_health``'s :class:`~reloadd_kube_manifests._health.HealthBook`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from reloadd import HealthReport

from .._applyset import ObjRef, parent_name
from .._events import record_event
from .._health import FileHealthState, FileState
from .._pods import provider_of, why_pods_wait
from .base import APPLY_FAILED, ConsumerBase

__all__ = ["HealthPart"]


class HealthPart(ConsumerBase):
    """Reports health, restores it after a restart, and announces a file failing or recovering."""

    def health(self) -> HealthReport:
        """Objects by health, files not current, save → current seconds (see ``_health``)."""
        return self._book.report()

    def _restore_health(self) -> None:
        """Files applied by an earlier run: progressing until the watch's first list judges their objects."""
        members: dict[Path, list[ObjRef]] = {}
        for ref, member in self.ledger.members.items():
            members.setdefault(member.path, []).append(ref)
        for path, refs in members.items():
            self._book.restore(path, tuple(sorted(refs)))

    def _health_moved(self, path: Path, old: FileState | None, f: FileHealthState) -> None:
        """A file's health changed: one WARNING and an Event when it fails and when it recovers; tell the core."""
        if f.state is FileState.FAILED and f.failure[1] != APPLY_FAILED:  # a refused apply: the core warned already
            self.stats["files_health_failed"] += 1
            self._health_failed.add(path)
            self._spawn(self._announce_failure(path, f))
        elif f.state is FileState.CURRENT and path in self._health_failed:
            self._health_failed.discard(path)
            self.log.warning("Health of %s recovered: every object is current", path)
            self._spawn_event(path, "HealthRecovered", f"{path}: every object is current", warning=False)
        f.wave = self._waves.get(path)
        self._wave_moved.set()
        self.ctx.health_changed()

    async def _announce_failure(self, path: Path, f: FileHealthState) -> None:
        """One WARNING and a ``HealthFailed`` Event; a failed workload's waiting pods named first, and the file
        of another consumer that provides an image they wait for (see ``_pods``)."""
        culprit = f.culprit
        if culprit is not None and self.client is not None and f.failure[1] != "Terminating":
            problems = await why_pods_wait(self.client, culprit,
                                           lambda image: provider_of(image, self.ctx.provided("image")))
            if problems and f.state is FileState.FAILED and f.culprit == culprit:
                obj, reason, message = f.failure
                f.failure = (obj, reason, "; ".join([message, *problems] if message else problems))
        text = ": ".join(p for p in f.failure if p)
        self.log.warning("Health of %s failed: %s", path, text)
        self._spawn_event(path, "HealthFailed", f"{path}: {text}", warning=True)

    def _spawn_event(self, path: Path, reason: str, message: str, *, warning: bool) -> None:
        if self.client is None or self.settings.dry_run:
            return
        self._spawn(record_event(
            self.client, self.settings.namespace, parent_name(self.key(path)), reason=reason, message=message,
            warning=warning, component=f"reloadd/{self.name}", log=self.log))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._event_tasks.add(task)
        task.add_done_callback(self._event_tasks.discard)
