"""Lease traffic of three applier candidates, from the apiserver's audit log (real ``reloadd run`` processes).

client-go since 1.30 (kubernetes#122069) renews with one PUT of the cached Lease, its last seen
resourceVersion as the precondition, and GETs only after that PUT failed; a standby GETs once per try. So
what the apiserver serves for one Lease stays: the leader's one write per retry period plus each standby's
one read per (jittered) retry period, whatever else the cluster holds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.kube.apiserver import KubeCluster
from tests.waiting import until

from .support import cm
from .test_km_fleet import NODES, RETRY, Node, leaders, value, writes

pytestmark = pytest.mark.timeout(300)

WINDOW = 8.0  # seconds of steady state counted: 16 retry periods


@pytest.fixture
async def candidates(tmp_path: Path) -> AsyncIterator[tuple[KubeCluster, dict[str, Node]]]:
    async with KubeCluster(controllers=(), users=NODES, audit=True) as kube:
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fleet"}}, "/api/v1/namespaces/fleet")
        made = {n: Node(n, tmp_path, kube) for n in NODES}
        try:
            yield kube, made
        finally:
            for node in made.values():
                await asyncio.to_thread(node.stop)


def lease_requests(events: list[dict[str, Any]], user: str) -> dict[str, int]:
    """Requests on Leases by ``user``, by verb."""
    out: dict[str, int] = {}
    for e in events:
        if (e.get("user") or {}).get("username") == user and (e.get("objectRef") or {}).get("resource") == "leases":
            out[e["verb"]] = out.get(e["verb"], 0) + 1
    return out


async def test_renew_is_one_put_standbys_read_once_per_retry_and_one_applier_writes(
        candidates: tuple[KubeCluster, dict[str, Node]]) -> None:
    kube, nodes = candidates
    for node in nodes.values():
        node.write("a.yaml", [cm("a", "fleet", v="1")])
        node.start()
    await until(lambda: value(kube, "a") == "1", what="the first pass applied", timeout=60, thread=True)
    await until(lambda: len(leaders(nodes)) == 1 and all(n.note() for n in nodes.values()),
                what="one leader, two standbys answering", timeout=60, thread=True)
    [leader] = await asyncio.to_thread(leaders, nodes)
    standbys = [n for n in NODES if n != leader]

    # Steady state, counted by the server.
    start = len(await asyncio.to_thread(kube.audit_events))
    t0 = time.monotonic()
    await asyncio.sleep(WINDOW)  # what is measured is the idle traffic over this window
    window = time.monotonic() - t0
    events = (await asyncio.to_thread(kube.audit_events))[start:]
    periods = window / RETRY

    led = lease_requests(events, leader)
    # The renew is one request: a PUT with the cached resourceVersion, no GET before it.
    assert led.get("get", 0) == 0, led
    assert periods * 0.5 <= led.get("update", 0) <= periods + 2, (led, periods)
    assert set(led) == {"update"}, led
    for name in standbys:
        stood = lease_requests(events, name)
        # One read per try: every retry period stretched by up to 1.2 (jitter), nothing written.
        assert set(stood) == {"get"}, stood
        assert periods / 1.2 * 0.5 <= stood["get"] <= periods + 2, (name, stood, periods)
    ok = [e for e in events if (e.get("objectRef") or {}).get("resource") == "leases"]
    assert all((e.get("responseStatus") or {}).get("code") == 200 for e in ok), [
        (e["verb"], e["user"]["username"], e.get("responseStatus")) for e in ok if e["responseStatus"]["code"] != 200]

    # One applier writes while three candidates run: a new file on every copy is applied by the leader alone.
    for node in nodes.values():
        node.write("b.yaml", [cm("b", "fleet", v="1")])
    await until(lambda: value(kube, "b") == "1", what="b.yaml applied", timeout=60, thread=True)
    await asyncio.sleep(3 * RETRY)  # the standbys' passes over b.yaml: what is asserted is that they write nothing
    authors = {user for _t, user, _verb, _ref in await asyncio.to_thread(writes, kube)}
    assert authors == {leader}, await asyncio.to_thread(writes, kube)
