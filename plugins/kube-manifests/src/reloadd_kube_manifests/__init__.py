"""reloadd consumer ``kube-manifests``: server-side apply a folder of manifests, one ApplySet per file.

Configure it as::

    [[consumer]]
    name = "manifests"
    plugin = "kube-manifests"
    paths = ["/var/lib/reloadd/manifests"]
    [consumer.options]
    kubeconfig = "/etc/rancher/k3s/k3s.yaml"   # default: $KUBECONFIG, ~/.kube/config, then in-cluster
    field_manager = "reloadd"
    force = true
    namespace = "kube-system"                  # where the ApplySet parents live
    prune = true
    dry_run = false
    concurrency = 16                           # batches at once: a stuck file does not hold back the rest
    move_grace = "5s"                          # a deleted file's objects wait for a move target; 0 = off
"""

from __future__ import annotations

from reloadd import ConsumerContext

from ._applyset import LABEL_ID, LABEL_PART_OF, applyset_id, parent_name
from ._client import ApiError, ApiUnavailable, KubeClient, RequestDropped
from ._consumer import KubeManifestsConsumer
from ._discovery import Discovery, Resource
from ._kubeconfig import ClusterConfig, load_cluster_config
from ._manifests import Manifest, ManifestError, load_manifest, parse_manifest
from ._settings import Settings

__all__ = [
    "LABEL_ID",
    "LABEL_PART_OF",
    "ApiError",
    "ApiUnavailable",
    "ClusterConfig",
    "Discovery",
    "KubeClient",
    "KubeManifestsConsumer",
    "Manifest",
    "ManifestError",
    "RequestDropped",
    "Resource",
    "Settings",
    "applyset_id",
    "create",
    "load_cluster_config",
    "load_manifest",
    "parent_name",
    "parse_manifest",
]


def create(ctx: ConsumerContext) -> KubeManifestsConsumer:
    """Entry point: validate the options and build the consumer.

    Raises:
        reloadd.ConfigError: for unknown or mistyped options.
    """
    base = ctx.config_file.parent if ctx.config_file is not None else None
    settings = Settings.from_options(ctx.options, where=f"consumer {ctx.name!r} options", base=base)
    return KubeManifestsConsumer(ctx, settings)
