"""kube-manifests under a crash of the API server: SIGKILL kube-apiserver in the middle of a large apply.

A private control plane (tests/kube/apiserver.py; the session one is shared and must not be
killed) and `reloadd run` with the kube-manifests consumer. A file of 150 ConfigMaps is
dropped in; once part of them exist, kube-apiserver is SIGKILLed and started again on the same
etcd. The engine retries; afterwards every object exists with the file's content, nothing is
failing, and a later edit (which prunes) still applies.

tests/kube/apiserver.py has no restart method yet: the process is restarted here with the
argv it was started with (read from /proc).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.faults._daemon import Daemon
from tests.kube.apiserver import KubeCluster
from tests.waiting import until

pytestmark = pytest.mark.timeout(240)

COUNT = 150
NS = "faults"


def cm(name: str, v: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS}, "data": {"v": v}}


def write_atomic(path: Path, objs: list[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n---\n".join(json.dumps(o) for o in objs))
    tmp.rename(path)


def configmaps(kube: KubeCluster, field: str = "v") -> dict[str, str]:
    """name → data.v (or resourceVersion) of the ConfigMaps in the test namespace ({} while the server is down)."""
    try:
        status, body = kube.request("GET", f"/api/v1/namespaces/{NS}/configmaps")
    except OSError:
        return {}
    if status != 200:
        return {}
    items = (json.loads(body) if isinstance(body, str) else body)["items"]
    return {
        i["metadata"]["name"]: i["metadata"]["resourceVersion"] if field == "rv" else i.get("data", {}).get("v", "")
        for i in items
        if i["metadata"]["name"] != "kube-root-ca.crt"
    }


def restart_apiserver(kube: KubeCluster) -> None:
    """SIGKILL kube-apiserver and start it again with the same argv (etcd keeps the data)."""
    proc = kube._procs["kube-apiserver"]
    argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    kube._spawn("kube-apiserver", [a.decode() for a in argv])
    kube._wait_ready()


async def test_apiserver_killed_mid_apply(tmp_path: Path, reliability) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    with KubeCluster(workdir=tmp_path / "kube", controllers=()) as kube:
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}, f"/api/v1/namespaces/{NS}")
        sock = tmp_path / "ctl.sock"
        cfg = tmp_path / "reloadd.toml"
        cfg.write_text(textwrap.dedent(f"""
            [reloadd]
            state_dir = "{tmp_path / 'state'}"
            control_socket = "{sock}"
            quiet = "100ms"
            [[consumer]]
            name = "manifests"
            plugin = "kube-manifests"
            paths = ["{manifests}"]
            [consumer.options]
            kubeconfig = "{kube.kubeconfig}"
            parallel = 2
        """))
        want = {f"cm-{i:03d}": "1" for i in range(COUNT)}
        async with Daemon(cfg, tmp_path / "daemon.log", control_socket=sock) as daemon:
            await until(daemon.idle, what="reloadd started")
            write_atomic(manifests / "many.yaml", [cm(n, v) for n, v in want.items()])
            await until(lambda: len(configmaps(kube)) >= 10, what="the apply to be under way")
            at_kill = configmaps(kube, "rv")
            await asyncio.to_thread(restart_apiserver, kube)
            await until(lambda: configmaps(kube) == want and daemon.idle(),
                        timeout=120, what="every ConfigMap applied after the API server came back")
            rewritten = sum(1 for n, rv in configmaps(kube, "rv").items() if n in at_kill and at_kill[n] != rv)
            present = configmaps(kube)
            applied = sum(1 for n, v in want.items() if present.get(n) == v)
            doc = daemon.status()
            assert doc is not None
            assert doc["consumers"]["manifests"]["failing"] == []
            assert doc["consumers"]["manifests"]["rejected"] == []
            # a later edit still applies, and prunes what the file no longer names
            after = {n: "2" for n in list(want)[:5]}
            before_edit = set(configmaps(kube))
            write_atomic(manifests / "many.yaml", [cm(n, v) for n, v in after.items()])
            await until(lambda: configmaps(kube) == after and daemon.idle(), timeout=60, what="edit and prune")
            pruned = len(before_edit - set(configmaps(kube)))
    reliability.record("kube-manifests: SIGKILL kube-apiserver mid-apply, restart it", trials=1, expected=COUNT,
                       delivered=applied, duplicates=rewritten,
                       notes=f"duplicates = objects written again after the restart; {len(at_kill)} of {COUNT} "
                             f"ConfigMaps existed at the kill; {applied} after, then an edit pruned {pruned}")
