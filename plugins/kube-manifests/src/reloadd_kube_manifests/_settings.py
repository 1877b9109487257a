"""The consumer's options, validated once at load time."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reloadd import ConfigError, Options

from ._lease import LeaseSettings

__all__ = ["MAX_CONCURRENCY", "MAX_FILE_SIZE", "MAX_PARALLEL", "MAX_PRUNE", "Settings"]

MAX_FILE_SIZE = 1 << 30
"""The largest ``max_file_size`` accepted (1 GiB): a manifest is parsed in memory, whole."""
MAX_PARALLEL = 256
"""The largest ``parallel``: each object in flight is one request to the API server."""
MAX_PRUNE = 1 << 31
"""The largest ``max_prune``; 0 already means "no limit"."""
MAX_CONCURRENCY = 64
"""The largest ``concurrency``: each file in flight holds its objects and its requests."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Validated ``[consumer.options]``.

    Attributes:
        kubeconfig: Kubeconfig file; ``None`` = kubectl's order: ``$KUBECONFIG``, else ``~/.kube/config``,
            else the in-cluster service account.
        context: Kubeconfig context (default: its current-context).
        field_manager: Server-side-apply field manager.
        force: Take over fields other managers own (as k3s does); off reports a conflict instead.
        namespace: Where the ApplySet parent ConfigMaps live.
        prune: Delete objects that left a file, and everything of a deleted file.
        dry_run: Send every write with ``dryRun=All`` (nothing changes in the cluster).
        max_file_size: Files larger than this many bytes are rejected unread.
        crd_timeout: Seconds to wait for a CRD to become established and served.
        parallel: Objects applied at once (within one apply rank), across the files in flight. Default 16, as
            the client's pool of connections: the folder first pass (1,001 objects) measured ~6 % faster
            than with 8 and ~25 % faster than with 4, on a pass CPU-bound on 2 cores.
        concurrency: Files applied at once, across batches; a file slow or stuck in retries holds one
            slot and no other file waits for it (each file is settled as soon as it is done). Default 16:
            object requests in flight stay bounded by ``parallel`` and all requests by the client's pool of
            16 connections, while each file's parent request overlaps other files' objects (the folder
            first pass measured ~8 % faster than with 4).
        resync_interval: Seconds between forced passes over every file (drift correction, k3s#3711);
            0 disables them (SIGHUP still forces one).
        move_grace: Seconds the removal of a deleted file waits for a file that declares its objects (the
            other half of a move that reached the consumer in another batch); 0 removes at once.
        max_prune: Deleted files whose removals would delete more than this many objects in one pass
            are held (prune safety) until ``reloadd reload --confirm-prune`` or until they come back;
            ``None``: half of the objects the consumer applied, and at least 10; 0: no limit.
        leader_elect: Apply and prune only while holding a Lease (several nodes watching copies of one
            folder); the others stand by.
        lease_name: The Lease (``None``: ``reloadd-<consumer name>``).
        lease_namespace: Its namespace (``None``: ``namespace``).
        lease_duration: Seconds a standby waits after it last saw the Lease change.
        renew_deadline: Seconds the leader keeps trying to renew before it stops writing.
        retry_period: Seconds between tries to acquire or renew.
        health_timeout: Seconds a file's objects have, from its apply, to become current before the file
            is failed (``HealthTimeout``), as Flux's ``timeout``; also bounds how long a wave, and a
            consumer ordered ``after`` this one, wait for it.
    """

    kubeconfig: Path | None = None
    context: str | None = None
    field_manager: str = "reloadd"
    force: bool = True
    namespace: str = "kube-system"
    prune: bool = True
    dry_run: bool = False
    max_file_size: int = 5 * 1024 * 1024
    crd_timeout: float = 30.0
    parallel: int = 16
    concurrency: int = 16
    resync_interval: float = 0.0
    move_grace: float = 5.0
    max_prune: int | None = None
    leader_elect: bool = False
    lease_name: str | None = None
    lease_namespace: str | None = None
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    health_timeout: float = 300.0

    @classmethod
    def from_options(cls, table: Mapping[str, Any], where: str, base: Path | None = None) -> Settings:
        """Read ``table`` strictly (unknown keys raise :class:`reloadd.ConfigError`)."""
        opts = Options(table, where=where)
        settings = cls(
            kubeconfig=opts.path("kubeconfig", base=base),
            context=opts.str("context"),
            field_manager=opts.str("field_manager", "reloadd"),
            force=opts.bool("force", True),
            namespace=opts.str("namespace", "kube-system"),
            prune=opts.bool("prune", True),
            dry_run=opts.bool("dry_run", False),
            max_file_size=opts.int("max_file_size", 5 * 1024 * 1024, minimum=1, maximum=MAX_FILE_SIZE),
            crd_timeout=opts.duration("crd_timeout", 30.0),
            parallel=opts.int("parallel", 16, minimum=1, maximum=MAX_PARALLEL),
            concurrency=opts.int("concurrency", 16, minimum=1, maximum=MAX_CONCURRENCY),
            resync_interval=opts.duration("resync_interval", 0.0),
            move_grace=opts.duration("move_grace", 5.0),
            max_prune=opts.int("max_prune", None, minimum=0, maximum=MAX_PRUNE),
            leader_elect=opts.bool("leader_elect", False),
            lease_name=opts.str("lease_name"),
            lease_namespace=opts.str("lease_namespace"),
            lease_duration=opts.duration("lease_duration", 15.0),
            renew_deadline=opts.duration("renew_deadline", 10.0),
            retry_period=opts.duration("retry_period", 2.0),
            health_timeout=opts.duration("health_timeout", 300.0),
        )
        opts.finish()
        problem = LeaseSettings("x", "x", settings.lease_duration, settings.renew_deadline,
                                settings.retry_period).problem()
        if settings.leader_elect and problem is not None:
            raise ConfigError(f"{where}: {problem}")
        return settings
