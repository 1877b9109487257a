"""Fleet: three reloadd processes (one per "node") on copies of one manifests folder, one apiserver.

Each process has its own state dir, folder copy and token (user node-a/b/c), and ``leader_elect`` on a
Lease with short timings; the apiserver writes an audit log, so who wrote what is the server's record, not
ours. The processes are real daemons (``python -m reloadd run``) killed, paused and stopped with signals.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from reloadd._ops._control import request
from tests.kube.apiserver import KubeCluster
from tests.waiting import until

from .support import cm

pytestmark = pytest.mark.timeout(300)

NODES = ("node-a", "node-b", "node-c")
LEASE = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/reloadd-manifests"
DURATION, DEADLINE, RETRY = 3.0, 2.0, 0.5


@pytest.fixture
async def fleet_kube() -> AsyncIterator[KubeCluster]:
    async with KubeCluster(controllers=(), users=NODES, audit=True) as kube:
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fleet"}},
                   "/api/v1/namespaces/fleet")
        yield kube


class Node:
    def __init__(self, name: str, root: Path, kube: KubeCluster) -> None:
        self.name = name
        self.dir = root / name
        self.manifests = self.dir / "manifests"
        self.manifests.mkdir(parents=True)
        self.socket = self.dir / "control.sock"
        self.config = self.dir / "reloadd.toml"
        self.config.write_text(f"""
[reloadd]
state_dir = "{self.dir / 'state'}"
control_socket = "{self.socket}"
quiet = "50ms"
ready_max_age = "1s"

[[consumer]]
name = "manifests"
plugin = "kube-manifests"
paths = ["{self.manifests}"]
[consumer.options]
kubeconfig = "{kube.kubeconfig_for(name)}"
move_grace = "0s"
leader_elect = true
lease_duration = "{DURATION:g}s"
renew_deadline = "{DEADLINE:g}s"
retry_period = "{RETRY:g}s"
""")
        self.proc: subprocess.Popen[bytes] | None = None

    def write(self, rel: str, objs: list[dict[str, Any]]) -> None:
        tmp = self.manifests / f".{rel}.tmp"
        tmp.write_text("\n---\n".join(json.dumps(o) for o in objs))
        tmp.rename(self.manifests / rel)

    def start(self) -> None:
        log = open(self.dir / "reloadd.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "reloadd", "run", "--config", str(self.config)],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def note(self) -> str:
        """The consumer's state line from the running daemon ('' when it does not answer)."""
        try:
            doc = request(self.socket, "status", timeout=2.0)["status"]
            return str(doc["consumers"]["manifests"].get("note") or "")
        except Exception:  # not up yet, stopped, or paused: no answer
            return ""

    def ready(self) -> bool:
        try:
            return bool(request(self.socket, "status", timeout=2.0)["status"]["ready"])
        except Exception:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
async def nodes(fleet_kube: KubeCluster, tmp_path: Path) -> AsyncIterator[dict[str, Node]]:
    made = {n: Node(n, tmp_path, fleet_kube) for n in NODES}
    yield made
    for node in made.values():
        await asyncio.to_thread(node.stop)


def holder(kube: KubeCluster) -> str:
    lease = kube.get(LEASE)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def leaders(nodes: dict[str, Node]) -> list[str]:
    return [n for n, node in nodes.items() if node.note().startswith("leader")]


def writes(kube: KubeCluster) -> list[tuple[float, str, str, str]]:
    """(time, user, verb, resource/name) of every successful write by a node, Lease writes excluded."""
    out = []
    for e in kube.audit_events():
        user = (e.get("user") or {}).get("username", "")
        ref = e.get("objectRef") or {}
        if (user in NODES and e.get("verb") in ("create", "update", "patch", "delete")
                and ref.get("resource") != "leases" and (e.get("responseStatus") or {}).get("code", 500) < 300):
            stamp = e.get("stageTimestamp") or e.get("requestReceivedTimestamp")
            out.append((_ts(stamp), user, e["verb"], f"{ref.get('resource')}/{ref.get('name')}"))
    return sorted(out)


def lease_writes(kube: KubeCluster) -> list[tuple[float, str, str]]:
    """(time, user, verb) of every successful Lease write by a node (the audit log's)."""
    out = []
    for e in kube.audit_events():
        user = (e.get("user") or {}).get("username", "")
        if (user in NODES and (e.get("objectRef") or {}).get("resource") == "leases"
                and e.get("verb") in ("create", "update") and (e.get("responseStatus") or {}).get("code", 500) < 300):
            out.append((_ts(e.get("stageTimestamp") or e["requestReceivedTimestamp"]), user, e["verb"]))
    return sorted(out)


def _ts(text: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def value(kube: KubeCluster, name: str) -> str | None:
    obj = kube.get(f"/api/v1/namespaces/fleet/configmaps/{name}")
    return None if obj is None else obj["data"]["v"]


async def test_one_leader_applies_takeovers_are_fenced_and_foreign_sets_stay(
        fleet_kube: KubeCluster, nodes: dict[str, Node]) -> None:
    kube = fleet_kube
    for name, node in nodes.items():
        node.write("a.yaml", [cm("a", "fleet", v="1")])
        if name != "node-c":  # node-c's copy lacks b.yaml: it must never prune what b.yaml made
            node.write("b.yaml", [cm("b", "fleet", v="1")])
    nodes["node-a"].start()
    await until(lambda: value(kube, "a") == "1" and value(kube, "b") == "1",
                what="node-a applied", timeout=60, thread=True)
    for name in ("node-b", "node-c"):
        nodes[name].start()
    await until(lambda: all(n.note() for n in nodes.values()), what="every daemon answering", timeout=60, thread=True)
    assert leaders(nodes) == ["node-a"], [n.note() for n in nodes.values()]
    assert all(n.note().startswith("standby (leader: ") for k, n in nodes.items() if k != "node-a")
    await asyncio.sleep(2.0)  # the standbys handled (and deferred) their copies meanwhile, past ready_max_age
    assert {w[1] for w in writes(kube)} == {"node-a"}, writes(kube)
    assert all(await asyncio.gather(*(asyncio.to_thread(n.ready) for n in nodes.values()))), "a standby is unready"

    # kill -9 of the leader: a standby holds the Lease within lease_duration + retry_period (times 1.2 jitter).
    old = holder(kube)
    nodes["node-a"].signal(signal.SIGKILL)
    killed = time.monotonic()
    for name in ("node-b", "node-c"):
        nodes[name].write("a.yaml", [cm("a", "fleet", v="2")])  # the edit made right after the kill
    await until(lambda: holder(kube) not in ("", old), what="a new Lease holder", timeout=30, thread=True)
    took = time.monotonic() - killed
    assert took <= DURATION + 1.2 * RETRY + 0.5, f"new holder after {took:.1f}s"
    await until(lambda: value(kube, "a") == "2", what="the edit applied by the new leader", timeout=30, thread=True)
    (second,) = await asyncio.to_thread(leaders, nodes)
    third = "node-b" if second == "node-c" else "node-c"

    # SIGSTOP of that leader past its lease, then SIGCONT: it writes nothing after the next leader's first write.
    nodes[second].signal(signal.SIGSTOP)
    await until(lambda: third in leaders({third: nodes[third]}), what="the last node leading", timeout=30, thread=True)
    nodes[third].write("a.yaml", [cm("a", "fleet", v="3")])
    await until(lambda: value(kube, "a") == "3", what="the third leader's edit", timeout=30, thread=True)
    first_write = min(t for t, user, _v, _r in writes(kube) if user == third)
    nodes[second].write("a.yaml", [cm("a", "fleet", v="stale")])  # what the paused leader would apply on waking
    nodes[second].signal(signal.SIGCONT)
    await asyncio.sleep(3 * RETRY + DEADLINE)  # what is asserted is that nothing is written
    late = [w for w in writes(kube) if w[1] == second and w[0] > first_write]
    assert late == [], late
    assert value(kube, "a") == "3"
    assert await asyncio.to_thread(leaders, nodes) == [third]
    assert value(kube, "b") == "1", "a node whose copy lacks b.yaml pruned it"
    if third == "node-c":
        assert "foreign ApplySet" in nodes[third].note() and "manifests:b.yaml" in nodes[third].note()

    # SIGTERM: the Lease is released, and the other takes over within two retry periods of the release.
    nodes[third].signal(signal.SIGTERM)
    await until(lambda: second in leaders({second: nodes[second]}),
                what="takeover after a clean stop", timeout=30, thread=True)
    released = max(t for t, user, verb in lease_writes(kube) if user == third)
    taken = min(t for t, user, verb in lease_writes(kube) if user == second and t > released)
    assert taken - released <= 2 * RETRY, f"taken over {taken - released:.2f}s after the release"
    await asyncio.sleep(1.0)  # the forced pass of the last leader: what is asserted is that it prunes nothing
    assert value(kube, "b") == "1", "a node whose copy lacks b.yaml pruned it"
    if second == "node-c":
        note = await asyncio.to_thread(nodes[second].note)
        assert "foreign ApplySet" in note and "manifests:b.yaml" in note, note

    # The apiserver restarted under a leader (node-a and the stopped one start again as standbys): one Lease,
    # so never two holders, and a leader again once it is back.
    for name in NODES:
        if name != second:
            await asyncio.to_thread(nodes[name].stop)  # reaped (killed, or stopping after its SIGTERM)
            nodes[name].start()
    await until(lambda: sum(bool(n.note()) for n in nodes.values()) == 3,
                what="all three daemons up", timeout=60, thread=True)
    await asyncio.to_thread(kube.restart_apiserver)
    counts = []
    end = time.monotonic() + DURATION + 3.0
    while time.monotonic() < end:
        counts.append(len(await asyncio.to_thread(leaders, nodes)))
    await until(lambda: len(leaders(nodes)) == 1, what="one leader after the restart", timeout=30, thread=True)
    assert max(counts) <= 1, counts


@pytest.mark.parametrize(("options", "why"), [
    ({"lease_duration": "2s", "renew_deadline": "3s"}, "lease_duration must be longer than renew_deadline"),
    ({"renew_deadline": "2s", "retry_period": "2s"}, "renew_deadline must be longer than 1.2"),
    ({"lease_duration": "1500ms", "renew_deadline": "1s", "retry_period": "0.5s"}, "whole number of seconds"),
])
def test_impossible_lease_timings_are_a_config_error(options: dict[str, str], why: str) -> None:
    from reloadd_kube_manifests import Settings

    from reloadd import ConfigError

    with pytest.raises(ConfigError, match=why):
        Settings.from_options({"leader_elect": True, **options}, where="consumer 'manifests' options")
    Settings.from_options(options, where="x")  # without leader_elect the timings are not used
