"""The demo on a real node: the air-gap flow (a tarball and a Deployment of its image dropped together).

Used by ``run_demo`` when ``make kube`` has built the kubelet and kube-scheduler: its containerd is the node's
(the test bed's ``tests/kube/node.py``), and the manifest sample is a Deployment of the sample image.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from examples.demo._common import BOLD, DIM, IMAGE_V1, IMAGE_V2, RESET, SAMPLE_DROPS, run_command, say, until

__all__ = ["NODE_BINARIES", "hello_deployment", "node_binaries", "node_instructions", "smoke_node"]

NODE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")


def hello_deployment() -> str:
    """The node's sample manifest: a Deployment of the sample image, which no registry can serve."""
    return (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: hello\n  namespace: default\n"
        "spec:\n  replicas: 1\n  selector:\n    matchLabels: {app: hello}\n  template:\n"
        "    metadata:\n      labels: {app: hello}\n    spec:\n      terminationGracePeriodSeconds: 2\n"
        f"      containers:\n      - name: hello\n        image: {IMAGE_V1}\n"
        "        imagePullPolicy: Never   # air-gapped: only an image reloadd imported can run\n"
    )


def node_instructions(root: Path, rel: Path, samples: Path, ctr: str, cfg: Path, port: int, kube: Any) -> str:
    """What to drop where on the node, and what to run to see it (one screen with the smoke run's output)."""
    return "\n".join([
        f"{BOLD}reloadd demo is running{RESET} on node1 (work dir {root}). In another terminal:",
        "",
        f"{BOLD}1. Run an image no registry has{RESET}: drop its tarball and a Deployment of it together",
        f"     cp {samples}/hello.tar {rel}/images/ && cp {samples}/hello.yaml {rel}/manifests/",
        f"     {ctr} images ls -q            {DIM}# {IMAGE_V1} imported first ...{RESET}",
        f"     curl -s --cacert {kube.ca_file} -H 'Authorization: Bearer {kube.admin_token}' \\",
        f"       '{kube.server}/api/v1/namespaces/default/pods?labelSelector=app%3Dhello' | grep phase"
        f"   {DIM}# ... then applied: Running{RESET}",
        f"{BOLD}2. Add a registry mirror{RESET}: drop a registries.conf(5) file into {rel}/registries.conf.d/",
        f"     cp {samples}/50-demo-mirror.conf {rel}/registries.conf.d/; cat {root}/certs.d/*/hosts.toml",
        f"     {ctr} images pull --hosts-dir {root}/certs.d {IMAGE_V2}   {DIM}# served by the demo registry{RESET}",
        f"{BOLD}Watch it{RESET}: reloadd status --config {cfg}",
        f"     curl -s http://127.0.0.1:{port}/metrics | grep ^reloadd_   {DIM}# Ctrl-C stops everything{RESET}",
    ])


async def smoke_node(root: Path, folders: Path, samples: Path, ctd: str, cfg: Path, cluster: Any, port: int) -> None:
    """The air-gap flow on the node: tarball, mirror drop-in and Deployment dropped together, each step seen.

    Dropped once reloadd is ready (its start-up pass done), so they arrive as a running node's folders see
    them: one settle window, handed over in ``after`` order (mirrors, images, manifests).
    """
    from tests.kube.watch import condition, wait_for

    ctr = ["ctr", "-a", ctd, "-n", "k8s.io"]

    async def ready() -> bool:
        return (await run_command("curl", "-sf", f"http://127.0.0.1:{port}/readyz"))[0] == 0

    await until(ready, "reloadd ready")
    for sub, name in SAMPLE_DROPS:  # copied under an ignored name (*.tmp), then renamed in together
        shutil.copy(samples / name, folders / sub / f".{name}.tmp")
    for sub, name in SAMPLE_DROPS:
        os.rename(folders / sub / f".{name}.tmp", folders / sub / name)
    say("smoke: dropped images/hello.tar, registries.conf.d/50-demo-mirror.conf and manifests/hello.yaml together")
    hosts = root / "certs.d" / "docker.io" / "hosts.toml"

    async def mirrored() -> bool:
        return hosts.exists()

    await until(mirrored, str(hosts))
    say(f"smoke: mirror written: {hosts}")

    async def imported() -> bool:
        return IMAGE_V1 in (await run_command(*ctr, "images", "ls", "-q"))[1].split()

    await until(imported, f"{IMAGE_V1} in containerd")
    say(f"smoke: {IMAGE_V1} imported into containerd")

    async def applied() -> bool:
        return await asyncio.to_thread(cluster.get, "/apis/apps/v1/namespaces/default/deployments/hello") is not None

    await until(applied, "the Deployment")
    say("smoke: manifests/hello.yaml applied (Deployment default/hello)")
    pod = await asyncio.to_thread(
        wait_for, cluster, "/api/v1/namespaces/default/pods",
        lambda p: p["status"].get("phase") == "Running" and condition(p, "Ready") == "True",
        labels="app=hello", timeout=120)
    say(f"smoke: pod default/{pod['metadata']['name']} Running and Ready on {pod['spec']['nodeName']} "
        f"({IMAGE_V1}, never pulled)")
    manifest = folders / "manifests" / "hello.yaml"

    async def current() -> bool:  # reloadd's own word: every object of the file Current, read from its watch
        code, out = await run_command(sys.executable, "-m", "reloadd", "status", "--json", "--config", str(cfg))
        if code not in (0, 3):
            return False
        health = json.loads(out)["consumers"]["manifests"].get("health") or {}
        pending = [f for f in health.get("files", []) if f["path"] == str(manifest)]
        return not pending and health.get("objects", {}).get("current", 0) >= 2  # the ConfigMap and Deployment

    await until(current, "manifests/hello.yaml Current")
    say("smoke: manifests/hello.yaml Current (reloadd status: its ConfigMap and Deployment are Current)")
    code, out = await run_command(*ctr, "images", "pull", "--hosts-dir", str(root / "certs.d"), IMAGE_V2)
    if code != 0:
        raise RuntimeError(f"pull through the mirror failed: {out}")
    say(f"smoke: {IMAGE_V2} pulled through the mirror")
    code, out = await run_command(sys.executable, "-m", "reloadd", "status", "--config", str(cfg))
    say(out)
    if code not in (0, 3):
        raise RuntimeError(f"reloadd status failed ({code})")


def node_binaries() -> bool:
    """The kubelet and kube-scheduler are built (``make kube``) and the node's Debian packages are here."""
    from tests.infra.busybox import BUSYBOX
    from tests.kube.apiserver import kube_bin_dir

    return (all(os.access(kube_bin_dir() / b, os.X_OK) for b in NODE_BINARIES) and shutil.which("etcd") is not None
            and BUSYBOX.exists() and os.path.exists("/usr/lib/cni/bridge"))
