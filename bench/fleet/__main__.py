"""Benchmark: the apiserver's load from reloadd at fleet scale, the two roles of examples/kubernetes.

    python -m bench.fleet [--agents 10,50,100] [--window 600] [--md out.md]

For each N in ``--agents``, a fresh apiserver (v1.20.2, audit log) serves:

* 3 applier candidates: ``python -m reloadd run`` with the shipped applier config (kube-manifests, 20-file
  folder, ``leader_elect``, default timings: lease_duration 15 s, renew_deadline 10 s, retry_period 2 s),
  users applier-a/b/c so the audit log tells them apart;
* N node agents: ``python -m reloadd run`` with the shipped node-agent config (containerd-images and
  registry-mirrors on one private containerd 1.6), each with its own state dir, folders and a token of the
  ``reloadd-node`` ServiceAccount (TokenRequest) in ``KUBECONFIG``, as a node would have it within reach.

Once every process is ready and the leader's first pass is done, requests are counted over ``--window``
seconds from the audit log, by user and verb (the bench's own admin requests are left out), with the
apiserver's CPU time (``/proc/<pid>/stat``) over the same window. Expected: node agents 0; the candidates'
total one Lease write per retry period (the leader's renew, one PUT) plus one read per jittered retry period per
standby, whatever N is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from reloadd._ops._control import request
from tests.infra import private_containerd
from tests.kube.apiserver import KubeCluster
from tests.kube_manifests._corpus import KUBECTL
from tests.observability.kube_roles import NODE_AGENT, sa_token, token_kubeconfig, username

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "kubernetes"
CANDIDATES = ("applier-a", "applier-b", "applier-c")
AGENT_USER = username(NODE_AGENT)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def shipped_config(overlay: str) -> dict[str, Any]:
    """The role's reloadd.toml from its ConfigMap in examples/kubernetes."""
    for doc in yaml.safe_load_all((EXAMPLES / overlay / "configmap.yaml").read_text()):
        if doc and doc.get("kind") == "ConfigMap":
            return tomllib.loads(doc["data"]["reloadd.toml"])
    raise SystemExit(f"{overlay}: no ConfigMap")


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return json.dumps(v)


def write_toml(path: Path, settings: dict[str, Any], consumers: list[dict[str, Any]]) -> None:
    lines = ["[reloadd]", *(f"{k} = {toml_value(v)}" for k, v in settings.items())]
    for c in consumers:
        lines += ["", "[[consumer]]", *(f"{k} = {toml_value(v)}" for k, v in c.items() if k != "options")]
        lines += ["[consumer.options]", *(f"{k} = {toml_value(v)}" for k, v in c.get("options", {}).items())]
    path.write_text("\n".join(lines) + "\n")


def spawn(d: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(d / "reloadd.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "reloadd", "run", "--config", str(d / "reloadd.toml")],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})


def ready(sock: Path) -> bool:
    try:
        return bool(request(sock, "status", timeout=5.0)["status"]["ready"])
    except Exception:  # not up yet: no socket, or no answer
        return False


def wait(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)  # polling other processes (daemons, the apiserver): nothing of ours to await


async def one_size(n: int, window: float, files: int, root: Path) -> dict[str, Any]:
    """Run 3 candidates and ``n`` node agents; the window's counts."""
    async with private_containerd(root, release="1.6", hosts_dir=root / "ctd-certs.d") as ctd:
        return await asyncio.to_thread(_run, n, window, files, root, ctd.address, str(ctd.config_path))


def _run(n: int, window: float, files: int, root: Path, address: str, containerd_config: str) -> dict[str, Any]:
    with KubeCluster(controllers=(), users=CANDIDATES, audit=True) as kube:
        for overlay in ("node-agent", "applier"):
            subprocess.run([str(KUBECTL), f"--kubeconfig={kube.kubeconfig}", f"--cache-dir={root / 'kc'}", "apply",
                            "-k", str(EXAMPLES / overlay)], check=True, capture_output=True, timeout=120)
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fleet"}}, "/api/v1/namespaces/fleet")
        procs: dict[str, subprocess.Popen[bytes]] = {}
        socks: dict[str, Path] = {}
        applier = shipped_config("applier")
        [manifests] = applier["consumer"]
        for name in CANDIDATES:
            d = root / name
            (d / "manifests").mkdir(parents=True)
            for i in range(files):
                obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"f{i}", "namespace": "fleet"},
                       "data": {"v": "1"}}
                (d / "manifests" / f"f{i}.yaml").write_text(json.dumps(obj))
            socks[name] = d / "control.sock"
            write_toml(d / "reloadd.toml", {"state_dir": str(d / "state"), "control_socket": str(socks[name])},
                       [{**manifests, "paths": [str(d / "manifests")],
                         "options": {**manifests["options"], "kubeconfig": str(kube.kubeconfig_for(name))}}])
            procs[name] = spawn(d)
        agent = shipped_config("node-agent")
        for i in range(n):
            name = f"node-{i:03d}"
            d = root / name
            folders = {p: d / p.strip("/").replace("/", "-") for p in
                       ("/var/lib/reloadd/images", "/etc/containers/registries.conf.d", "/etc/containerd/certs.d")}
            for f in folders.values():
                f.mkdir(parents=True)
            moved: dict[str, str] = {**{k: str(v) for k, v in folders.items()},
                                     "/run/containerd/containerd.sock": address,
                                     "/etc/containerd/config.toml": containerd_config}
            consumers = [{**c, "paths": [moved[p] for p in c["paths"]],
                          "options": {k: moved.get(v, v) if isinstance(v, str) else v for k, v in c["options"].items()}}
                         for c in agent["consumer"]]
            socks[name] = d / "control.sock"
            write_toml(d / "reloadd.toml", {"state_dir": str(d / "state"), "control_socket": str(socks[name])},
                       consumers)
            token_kubeconfig(kube, sa_token(kube, NODE_AGENT, seconds=86400), d / "kubeconfig")
            procs[name] = spawn(d, {"KUBECONFIG": str(d / "kubeconfig")})
        try:
            wait("the leader's first pass", lambda: kube.get(f"/api/v1/namespaces/fleet/configmaps/f{files - 1}")
                 is not None, 300)
            wait(f"{n + 3} daemons ready", lambda: all(ready(s) for s in socks.values()), 600)
            dead = [k for k, p in procs.items() if p.poll() is not None]
            if dead:
                raise SystemExit(f"exited: {dead}")
            time.sleep(5)
            apiserver = kube._procs["kube-apiserver"].pid  # the bench's own fixture: its child's pid
            start = len(kube.audit_events())
            cpu0 = cpu_seconds(apiserver)
            t0 = time.monotonic()
            time.sleep(window)  # idle on purpose: the standing cost of the fleet
            elapsed = time.monotonic() - t0
            cpu = (cpu_seconds(apiserver) - cpu0) / elapsed * 100
            events = kube.audit_events()[start:]
            alive = sum(p.poll() is None for p in procs.values())
        finally:
            for p in procs.values():
                p.terminate()
            for p in procs.values():
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
    by: Counter[tuple[str, str]] = Counter()
    for e in events:
        user = (e.get("user") or {}).get("username", "")
        if user != "admin":
            by[(user, e.get("verb", ""))] += 1
    lease_writes = {c: by[(c, "update")] for c in CANDIDATES}
    leader = max(lease_writes, key=lambda c: lease_writes[c])
    return {"n": n, "elapsed": elapsed, "by": by, "leader": leader, "apiserver_cpu": cpu, "alive": alive,
            "processes": n + 3}


def render(results: list[dict[str, Any]], window: float) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"## Fleet: 3 applier candidates and N node agents ({when}, kube-apiserver v1.20.2)", "",
             f"Each N on a fresh apiserver with an audit log; {window:.0f} s idle window once every process was ready "
             "and the leader had applied its 20-file folder. Every process is a real `reloadd run` with the shipped "
             "config of its role (examples/kubernetes): node agents run containerd-images and registry-mirrors (one "
             "private containerd 1.6, own state dir, own `reloadd-node` token in `KUBECONFIG`); candidates run "
             "kube-manifests with `leader_elect` at the default timings (retry_period 2 s). Requests per second from "
             "the audit log, by user and verb; the bench's own admin requests left out.", "",
             "| N node agents | processes alive | node agents req/s | leader: lease get/s | leader: lease update/s "
             "| each standby: lease get/s | each standby: writes | candidates total req/s "
             "| apiserver CPU (% of a core) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        by, e, leader = r["by"], r["elapsed"], r["leader"]
        agents = sum(v for (u, _verb), v in by.items() if u == AGENT_USER)
        standbys = [c for c in CANDIDATES if c != leader]
        sb_get = "/".join(f"{by[(c, 'get')] / e:.2f}" for c in standbys)
        sb_write = "/".join(str(sum(by[(c, v)] for v in ("create", "update", "patch", "delete"))) for c in standbys)
        total = sum(v for (u, _verb), v in by.items() if u in CANDIDATES)
        lines.append(f"| {r['n']} | {r['alive']}/{r['processes']} | {agents / e:.2f} | "
                     f"{by[(leader, 'get')] / e:.2f} | {by[(leader, 'update')] / e:.2f} | {sb_get} | {sb_write} | "
                     f"{total / e:.2f} | "
                     f"{r['apiserver_cpu']:.1f} % |")
    lines += ["", "Requests by user and verb over the window (counts):", "",
              "| N | user | verb | requests | per second |", "|---|---|---|---|---|"]
    for r in results:
        for (user, verb), count in sorted(r["by"].items()):
            role = "leader" if user == r["leader"] else "standby" if user in CANDIDATES else ""
            lines.append(f"| {r['n']} | {user}{f' ({role})' if role else ''} | {verb} | {count} | "
                         f"{count / r['elapsed']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", default="10,50,100", help="comma-separated node-agent counts")
    ap.add_argument("--window", type=float, default=600.0, help="seconds counted per size")
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    results = []
    for n in (int(x) for x in args.agents.split(",")):
        with tempfile.TemporaryDirectory(prefix="reloadd-bench-fleet-") as tmp:
            r = asyncio.run(one_size(n, args.window, args.files, Path(tmp)))
        results.append(r)
        print(render([r], args.window), flush=True)
    text = render(results, args.window)
    print(text)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
