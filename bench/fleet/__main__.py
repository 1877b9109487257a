"""Benchmark: three idle reloadd processes with ``leader_elect`` on one apiserver.

    python -m bench.fleet [--idle 600] [--md out.md]

Three daemons (``python -m reloadd run``, users node-a/b/c, each with a copy of a 20-file folder and the
default timings: lease_duration 15 s, renew_deadline 10 s, retry_period 2 s) run for ``--idle`` seconds after
the leader's first pass. Reported, per process, from the apiserver's audit log: Lease reads and writes, writes
to other objects; and its CPU time (``/proc/<pid>/stat``) over the idle window. The peer figure is the bound
the design promises: one Lease write per retry period for the leader, none from standbys.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.kube.apiserver import KubeCluster

NODES = ("node-a", "node-b", "node-c")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=float, default=600.0)
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="reloadd-bench-fleet-") as tmp, \
            KubeCluster(controllers=(), users=NODES, audit=True) as kube:
        root = Path(tmp)
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fleet"}}, "/api/v1/namespaces/fleet")
        procs: dict[str, subprocess.Popen[bytes]] = {}
        for node in NODES:
            d = root / node
            (d / "manifests").mkdir(parents=True)
            for i in range(args.files):
                obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"f{i}", "namespace": "fleet"},
                       "data": {"v": "1"}}
                (d / "manifests" / f"f{i}.yaml").write_text(json.dumps(obj))
            (d / "reloadd.toml").write_text(
                f'[reloadd]\nstate_dir = "{d / "state"}"\nquiet = "100ms"\n\n[[consumer]]\nname = "manifests"\n'
                f'plugin = "kube-manifests"\npaths = ["{d / "manifests"}"]\n[consumer.options]\n'
                f'kubeconfig = "{kube.kubeconfig_for(node)}"\nleader_elect = true\n')
            with open(d / "reloadd.log", "ab") as log:
                procs[node] = subprocess.Popen([sys.executable, "-m", "reloadd", "run", "--config",
                                                str(d / "reloadd.toml")], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while kube.get(f"/api/v1/namespaces/fleet/configmaps/f{args.files - 1}") is None:
            if time.monotonic() > deadline:
                raise SystemExit("the leader did not apply the folder")
            time.sleep(0.2)  # polling the apiserver for the leader's first pass
        time.sleep(5)
        start_events = len(kube.audit_events())
        cpu0 = {n: cpu_seconds(p.pid) for n, p in procs.items()}
        t0 = time.monotonic()
        time.sleep(args.idle)  # idle on purpose: the cost of standing by and leading
        elapsed = time.monotonic() - t0
        cpu1 = {n: cpu_seconds(p.pid) for n, p in procs.items()}
        events = kube.audit_events()[start_events:]
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(timeout=30)
    rows = []
    for node in NODES:
        mine = [e for e in events if (e.get("user") or {}).get("username") == node]
        lease = [e for e in mine if (e.get("objectRef") or {}).get("resource") == "leases"]
        lw = sum(1 for e in lease if e.get("verb") in ("create", "update"))
        lr = sum(1 for e in lease if e.get("verb") == "get")
        other = sum(1 for e in mine if e.get("verb") in ("create", "update", "patch", "delete")
                    and (e.get("objectRef") or {}).get("resource") != "leases")
        cpu = (cpu1[node] - cpu0[node]) / elapsed * 100
        rows.append((node, lw, lr, other, cpu))
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"## Fleet: three idle processes, leader_elect ({when}, kube-apiserver v1.20.2)", "",
             f"{args.files} files per copy, default timings (retry_period 2 s), {elapsed:.0f} s idle after the "
             f"leader's first pass; counts from the apiserver's audit log. Bound: one Lease write per retry period "
             f"for the leader ({elapsed / 2:.0f}), none from standbys.", "",
             "| process | Lease writes | Lease reads | other writes | CPU (% of one core) |", "|---|---|---|---|---|"]
    lines += [f"| {n} | {lw} | {lr} | {o} | {c:.2f} % |" for n, lw, lr, o, c in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
