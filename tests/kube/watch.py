"""Wait for an object of a real cluster to reach a state, on the API server's watch: no polling loop.

A pod turning Running or a node turning Ready is an event the API server sends; a test waits for that
event (list once, then watch from the list's resourceVersion), not for a sleep to pass. Synchronous (the
test bed's client is ``urllib``): async tests call it through ``asyncio.to_thread``.

Example::

    pod = wait_for(kube, "/api/v1/namespaces/demo/pods", lambda p: phase(p) == "Running",
                   labels="app=web", timeout=60)
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from .apiserver import KubeCluster

__all__ = ["WaitTimeout", "condition", "wait_for"]


class WaitTimeout(AssertionError):
    """No object of the collection reached the state in time (the message shows the last ones seen)."""


def condition(obj: dict[str, Any], kind: str) -> str | None:
    """The status (``"True"``, ``"False"``, ``"Unknown"``) of ``obj``'s condition ``kind``, or None."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return None


def wait_for(
    kube: KubeCluster,
    collection: str,
    predicate: Callable[[dict[str, Any]], bool],
    *,
    name: str | None = None,
    labels: str | None = None,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """The first object of ``collection`` (e.g. ``/api/v1/nodes``) for which ``predicate`` holds.

    Args:
        name: Only the object of this name.
        labels: A label selector (``app=web``).
        timeout: Seconds in all; the watch is re-opened when the server ends it.

    Raises:
        WaitTimeout: with the last version of every object seen.
    """
    query: dict[str, str] = {}
    if name is not None:
        query["fieldSelector"] = f"metadata.name={name}"
    if labels is not None:
        query["labelSelector"] = labels
    deadline = time.monotonic() + timeout
    last: dict[str, dict[str, Any]] = {}
    while True:
        status, listing = kube.request("GET", f"{collection}?{urllib.parse.urlencode(query)}")
        if status != 200:
            raise AssertionError(f"GET {collection}: {status} {listing}")
        for obj in listing.get("items") or []:
            last[obj["metadata"]["name"]] = obj
            if predicate(obj):
                return dict(obj)
        rv = listing["metadata"]["resourceVersion"]
        left = deadline - time.monotonic()
        if left <= 0:
            break
        found = _watch(kube, collection, query, rv, predicate, last, left)
        if found is not None:
            return found
    shown = json.dumps({n: o.get("status") for n, o in last.items()}, indent=1)[:4000]
    raise WaitTimeout(f"nothing in {collection} ({query}) reached the state in {timeout}s; last seen: {shown}")


def _watch(
    kube: KubeCluster,
    collection: str,
    query: dict[str, str],
    rv: str,
    predicate: Callable[[dict[str, Any]], bool],
    last: dict[str, dict[str, Any]],
    left: float,
) -> dict[str, Any] | None:
    """Watch from ``rv`` for at most ``left`` seconds: the object found, or None to list again."""
    params = {**query, "watch": "1", "resourceVersion": rv, "timeoutSeconds": str(max(1, int(left + 0.999)))}
    req = urllib.request.Request(f"{kube.server}{collection}?{urllib.parse.urlencode(params)}")
    req.add_header("Authorization", f"Bearer {kube.admin_token}")
    try:
        with urllib.request.urlopen(req, context=kube.ssl_context, timeout=left + 5) as resp:
            for line in resp:
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    return None  # 410 Gone: the resourceVersion is too old, list again
                if event.get("type") in ("ADDED", "MODIFIED"):
                    last[obj["metadata"]["name"]] = obj
                    if predicate(obj):
                        return dict(obj)
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise AssertionError(f"watch {collection} failed: {exc}") from exc
    return None
