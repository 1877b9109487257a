"""Leader election glue (leader or standby, the status note) and the ApplySets of files this folder lacks.

A part of :class:`~reloadd_kube_manifests.KubeManifestsConsumer` (see ``_parts``); the elector itself is
``_lease``'s :class:`~reloadd_kube_manifests._lease.LeaderElector`, built in ``_consumer``'s ``_connect``.
"""

from __future__ import annotations

import asyncio
import time

from reloadd import ReloaddError

from .._applyset import LABEL_MANAGED_BY
from .base import ConsumerBase

__all__ = ["LeasePart"]


class LeasePart(ConsumerBase):
    """What becoming the leader or a standby does, and what status says of it."""

    def _became_leader(self) -> None:
        """Leader now: a forced pass over every file (edits made while standing by are applied), and a look for
        ApplySets of files this folder lacks (another node's: never pruned by this one)."""
        self.stats["leader"] = 1
        self.ctx.trigger(None)
        self._foreign_task = asyncio.get_running_loop().create_task(self._find_foreign())

    async def _find_foreign(self) -> None:
        """List the parents of this consumer's ApplySets whose file this process has not got (status names them)."""
        if self.client is None:
            return
        try:
            listed = await self.client.get(f"/api/v1/namespaces/{self.settings.namespace}/configmaps",
                                           {"labelSelector": f"{LABEL_MANAGED_BY}=reloadd"})
        except ReloaddError as exc:
            self.log.debug("Cannot list ApplySet parents: %s", exc)
            return
        ours = {self.key(p) for p in await asyncio.to_thread(self._present_files)} | {
            self.key(p) for p in self.ctx.records}
        foreign = []
        for item in (listed or {}).get("items") or ():
            key = str((item.get("data") or {}).get("key") or "")
            if key.startswith(f"{self.name}:") and key not in ours:
                foreign.append((key, str((item.get("metadata") or {}).get("name"))))
        self.foreign = sorted(foreign)
        if self.foreign:
            self.log.warning(
                "%d ApplySet(s) of files this folder lacks (another node's copy had them): %s; their objects are "
                "not pruned by this node (see the README: foreign ApplySets)", len(self.foreign),
                ", ".join(f"{k} (parent {self.settings.namespace}/{n})" for k, n in self.foreign[:10]))

    def _stood_by(self) -> None:
        self.stats["leader"] = 0

    @property
    def status_note(self) -> str | None:
        """``standby (leader: <identity>, since …)`` while another process holds the Lease (status shows it)."""
        e = self.elector
        if e is None:
            return None
        if e.may_write():
            foreign = (f"; {len(self.foreign)} foreign ApplySet(s), not pruned: "
                       + ", ".join(k for k, _ in self.foreign[:5])) if self.foreign else ""
            return f"leader (Lease {e.settings.namespace}/{e.settings.name}, as {e.identity}){foreign}"
        since = time.strftime("%H:%M:%S", time.localtime(e.holder_since)) if e.holder_since else "?"
        return f"standby (leader: {e.holder or 'none'}, since {since}; Lease {e.settings.namespace}/{e.settings.name})"

    def _standing_by(self) -> bool:
        return self.elector is not None and not self.elector.may_write()
