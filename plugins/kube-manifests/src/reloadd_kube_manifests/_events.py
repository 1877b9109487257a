"""Kubernetes Events about a file's ApplySet parent, so ``kubectl get events`` shows failed applies."""

from __future__ import annotations

import logging
import secrets
from datetime import UTC, datetime

from reloadd import ReloaddError

from ._client import KubeClient

__all__ = ["record_event"]

_MAX_MESSAGE = 1024


async def record_event(
    client: KubeClient,
    namespace: str,
    parent: str,
    *,
    reason: str,
    message: str,
    warning: bool,
    component: str,
    log: logging.Logger,
) -> None:
    """Create a core/v1 Event about ConfigMap ``namespace/parent``; failures are only logged."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{parent}.{secrets.token_hex(8)}", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "ConfigMap", "namespace": namespace, "name": parent},
        "reason": reason,
        "message": message[:_MAX_MESSAGE],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        await client.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
    except ReloaddError as exc:
        log.debug("Failed to record event for %s/%s: %s", namespace, parent, exc)
