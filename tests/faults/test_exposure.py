"""Exposure of a running `reloadd run`: listening sockets, file modes, and secrets in its output.

The daemon runs with a configuration shaped like ``examples/reloadd.toml`` (paths moved to a
tmp dir, the containerd consumer left out), a kubeconfig with a bearer token, and a
registries.yaml with registry credentials. Nothing may listen beyond loopback, the control
socket and state must be private, and neither secret may appear in its logs (debug level),
``reloadd status --json`` or /metrics.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import stat
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from tests.waiting import until

from ._daemon import Daemon

pytestmark = pytest.mark.timeout(120)

TOKEN = "kube-token-0f9e8d7c6b5a-do-not-leak"
PASSWORD = "registry-password-5e4d3c-do-not-leak"
AUTH = "cmVsb2FkZDpyZWdpc3RyeS1wYXNzd29yZA=="  # base64 "reloadd:registry-password"
SECRETS = (TOKEN, PASSWORD, AUTH)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def listening(pid: int) -> list[tuple[str, str, int]]:
    """(protocol, address, port) of every TCP socket in LISTEN and every bound UDP socket ``pid`` holds."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        for line in Path(f"/proc/{pid}/net/{proto}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if inode not in inodes or (proto.startswith("tcp") and state != "0A"):
                continue
            hex_ip, hex_port = local.split(":")
            raw = bytes.fromhex(hex_ip)
            # /proc prints the address as host-order 32-bit words
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.append((proto, str(ipaddress.ip_address(raw)), int(hex_port, 16)))
    return found


def write_inputs(tmp: Path, kube_port: int) -> None:
    (tmp / "kubeconfig").write_text(textwrap.dedent(f"""
        apiVersion: v1
        kind: Config
        clusters:
        - name: c
          cluster:
            server: https://127.0.0.1:{kube_port}
            insecure-skip-tls-verify: true
        users:
        - name: u
          user:
            token: {TOKEN}
        contexts:
        - name: c
          context: {{cluster: c, user: u}}
        current-context: c
    """))
    manifests = tmp / "manifests"
    manifests.mkdir()
    (manifests / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: default}\n")
    etc = tmp / "etc"
    (etc / "registries.conf.d").mkdir(parents=True)
    (etc / "registries.conf.d" / "50-mirror.conf").write_text(
        '[[registry]]\nprefix = "docker.io"\nlocation = "docker.io"\n'
        '[[registry.mirror]]\nlocation = "mirror.example.net"\n')
    (etc / "registries.yaml").write_text(textwrap.dedent(f"""
        mirrors:
          quay.io:
            endpoint: ["https://quay-mirror.example.net"]
        configs:
          quay-mirror.example.net:
            auth:
              username: reloadd
              password: {PASSWORD}
              auth: {AUTH}
              identitytoken: {TOKEN}
    """))
    (tmp / "hooks").mkdir()


def config(tmp: Path, metrics: str | None) -> Path:
    cfg = tmp / "reloadd.toml"
    listen = f'metrics_listen = "{metrics}"' if metrics else ""
    cfg.write_text(textwrap.dedent(f"""
        [reloadd]
        state_dir = "{tmp / 'state'}"
        quiet = "200ms"
        pid_file = "{tmp / 'run' / 'reloadd.pid'}"
        control_socket = "{tmp / 'run' / 'control.sock'}"
        {listen}

        [[consumer]]
        name = "mirrors"
        plugin = "registry-mirrors"
        [consumer.options]
        registries_conf = "{tmp / 'etc' / 'registries.conf'}"
        registries_conf_d = "{tmp / 'etc' / 'registries.conf.d'}"
        registries_yaml = "{tmp / 'etc' / 'registries.yaml'}"
        hosts_dir = "{tmp / 'certs.d'}"
        certs_dirs = []
        containerd_config = ""

        [[consumer]]
        name = "manifests"
        plugin = "kube-manifests"
        paths = ["{tmp / 'manifests'}"]
        include = ["*.yaml", "*.yml", "*.json"]
        [consumer.options]
        kubeconfig = "{tmp / 'kubeconfig'}"

        [[consumer]]
        name = "hooks"
        plugin = "exec"
        paths = ["{tmp / 'hooks'}"]
        [consumer.options]
        command = ["{sys.executable}", "-c", "import sys; sys.stdin.read()"]
    """))
    return cfg


async def status_json(cfg: Path) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "reloadd", "status", "--json", "--config",
                                                str(cfg), stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


@pytest.mark.parametrize("metrics", [None, "127.0.0.1:{port}"], ids=["default", "example-metrics"])
async def test_loopback_only_private_files_no_secrets(tmp_path: Path, metrics: str | None, reliability) -> None:
    kube_port = free_port()  # nothing listens there: every apply fails and is retried with an error
    write_inputs(tmp_path, kube_port)
    listen = metrics.format(port=free_port()) if metrics else None
    cfg = config(tmp_path, listen)
    sock = tmp_path / "run" / "control.sock"
    log = tmp_path / "daemon.log"
    async with Daemon(cfg, log, control_socket=sock, args=("--log-level", "debug")) as daemon:
        def troubled() -> bool:
            doc = daemon.status() or {}
            consumers = doc.get("consumers", {})
            return bool(consumers.get("manifests", {}).get("failing")) and consumers["mirrors"]["records"] >= 2

        await until(troubled, timeout=60, what="manifests failing against the closed port, mirrors applied")
        (tmp_path / "hooks" / "x.conf").write_text("x")
        await until(lambda: (tmp_path / "state" / "consumers" / "hooks").exists()
                    and any((tmp_path / "state" / "consumers" / "hooks").iterdir()), what="exec consumer state")
        sockets = listening(daemon.pid)
        code, status_out = await status_json(cfg)
        metrics_out = ""
        if listen:
            with urllib.request.urlopen(f"http://{listen}/metrics", timeout=5) as resp:
                metrics_out = resp.read().decode()
        control_mode = stat.S_IMODE(os.stat(sock).st_mode)
        state_mode = stat.S_IMODE(os.stat(tmp_path / "state").st_mode)
        state_modes = {str(p.relative_to(tmp_path)): os.lstat(p).st_mode for p in (tmp_path / "state").rglob("*")}
    # 1. nothing beyond loopback; nothing at all unless metrics_listen asks for it
    assert all(ipaddress.ip_address(addr).is_loopback for _, addr, _ in sockets), sockets
    if listen is None:
        assert sockets == []
    else:
        assert sockets == [("tcp", "127.0.0.1", int(listen.rsplit(":", 1)[1]))]
    # 2. private control socket and state
    assert control_mode == 0o600
    assert state_mode == 0o700
    files = {k: oct(stat.S_IMODE(m)) for k, m in state_modes.items() if stat.S_ISREG(m)}
    assert files and set(files.values()) == {"0o600"}, files
    dirs = {k: oct(stat.S_IMODE(m)) for k, m in state_modes.items() if stat.S_ISDIR(m)}
    assert all(int(m, 8) & 0o022 == 0 for m in dirs.values()), dirs  # below the 0700 root: nobody else gets in
    # 3. no secret in status, logs or metrics, although the errors and warnings are there
    assert code == 3  # answered, with a failing path
    assert f"127.0.0.1:{kube_port}" in status_out
    logs = log.read_text()
    assert "configs.'quay-mirror.example.net'.auth: credentials are not written" in logs  # seen, warned ...
    assert f"cannot connect to 127.0.0.1:{kube_port}" in logs  # the kube client did try
    leaks = {where: [s for s in SECRETS if s in text]
             for where, text in (("status", status_out), ("logs", logs), ("metrics", metrics_out))}
    assert leaks == {"status": [], "logs": [], "metrics": []}  # ... but never printed
    exposed = [addr for _, addr, _ in sockets if not ipaddress.ip_address(addr).is_loopback]
    found = sum(len(v) for v in leaks.values())
    reliability.record(f"exposure: `reloadd run`, {'metrics on loopback' if listen else 'defaults'}",
                       trials=1, expected=0, delivered=found + len(exposed),
                       notes=f"delivered = secrets found in status/logs/metrics ({found}) + non-loopback "
                             f"sockets ({len(exposed)}); listening: {sockets or 'none'}; control socket "
                             f"{oct(control_mode)}, state dir {oct(state_mode)}, files "
                             f"{sorted(set(files.values()))}, dirs {sorted(set(dirs.values()))}")
