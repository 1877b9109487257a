"""Kubeconfig semantics side by side with kubectl v1.20.2 (Debian's kubernetes-client), on the real apiserver.

Each case gives reloadd's loader and kubectl the same files and environment and asserts they agree:
``$KUBECONFIG`` with several files (first definition wins, relative paths per file), trust limited to the
kubeconfig's CA even when the system store holds another, exec plugins returning a token or a client
certificate, and inline key material that never touches the filesystem.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from reloadd_kube_manifests import ApiError, KubeClient, load_cluster_config
from reloadd_kube_manifests._transport import HttpError

from reloadd import ConfigError
from tests.reliability import Reliability

from ._corpus import KUBECTL
from .support import KubeCluster

pytestmark = pytest.mark.timeout(90)

def kubectl_ok(env: dict[str, str], *args: str) -> tuple[bool, str]:
    """Run Debian's kubectl v1.20.2 (never the one on PATH) with exactly ``env``; (succeeded, stderr)."""
    assert KUBECTL.exists(), f"{KUBECTL} missing: run `make kube` (scripts/infra/fetch-kubectl.sh)"
    proc = subprocess.run([str(KUBECTL), *args], env=env, capture_output=True, text=True, timeout=60)
    return proc.returncode == 0, proc.stderr


async def reloadd_ok(config_path: Path | None = None, **kw: Any) -> tuple[bool, str]:
    """Whether reloadd's client, loaded like the consumer loads it, can read kube-system."""
    try:
        client = KubeClient(load_cluster_config(config_path, **kw))
    except ConfigError as exc:
        return False, str(exc)
    try:
        await client.get("/api/v1/namespaces/kube-system")
    except (ApiError, HttpError, ssl.SSLError, OSError) as exc:
        return False, str(exc)
    except Exception as exc:  # the client maps transport errors to its own types
        return False, f"{type(exc).__name__}: {exc}"
    finally:
        await client.close()
    return True, ""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env.update(extra)
    return env


def _write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("order", ["good-first", "bad-first"])
async def test_kubeconfig_list_is_merged_like_kubectl(
    order: str, kube: KubeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reliability: Reliability
) -> None:
    """Context in one file, cluster (relative CA path) in another; a user defined in two: the first wins."""
    import shutil

    cdir = tmp_path / "clusters"
    cdir.mkdir()
    shutil.copy(kube.ca_file, cdir / "ca.crt")
    contexts = _write(tmp_path / "a" / "contexts.yaml", {
        "apiVersion": "v1", "kind": "Config", "current-context": "dev",
        "contexts": [{"name": "dev", "context": {"cluster": "k", "user": "me", "namespace": "apps"}}],
    })
    cluster = _write(cdir / "cluster.yaml", {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "k", "cluster": {"server": kube.server, "certificate-authority": "ca.crt"}}],
    })
    good = _write(tmp_path / "u1.yaml", {"apiVersion": "v1", "kind": "Config",
                                          "users": [{"name": "me", "user": {"token": kube.admin_token}}]})
    bad = _write(tmp_path / "u2.yaml", {"apiVersion": "v1", "kind": "Config",
                                         "users": [{"name": "me", "user": {"token": "not-a-token"}}]})
    users = [good, bad] if order == "good-first" else [bad, good]
    missing = tmp_path / "does-not-exist.yaml"
    listed = os.pathsep.join(map(str, [missing, contexts, cluster, *users]))

    ours, why = await _with_env(monkeypatch, listed)
    theirs, err = kubectl_ok(_env(KUBECONFIG=listed), "get", "namespace", "kube-system")
    assert ours is theirs is (order == "good-first"), (why, err)
    if order == "good-first":
        monkeypatch.setenv("KUBECONFIG", listed)
        assert load_cluster_config(sa_dir=tmp_path / "no-sa").namespace == "apps"
    reliability.record(f"kube-manifests: $KUBECONFIG of {len(listed.split(os.pathsep))} files (one missing), "
                       f"the {order.split('-')[0]} "
                       "token defined first", trials=1, expected=int(order == "good-first"), delivered=int(ours),
                       notes=f"delivered = reloadd reached the API server; kubectl v1.20.2: "
                             f"{'reached it' if theirs else 'refused too'}")


async def _with_env(monkeypatch: pytest.MonkeyPatch, kubeconfig: str) -> tuple[bool, str]:
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return await reloadd_ok(None)


def _ca_data(kube: KubeCluster) -> str:
    return base64.b64encode(kube.ca_file.read_bytes()).decode()


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def foreign_tls_server(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A TLS server on 127.0.0.1 whose certificate is signed by a CA the kubeconfig does not name.

    Yields its port and that CA's file (the tests put it in the "system" store via SSL_CERT_FILE).
    """
    d = tmp_path / "foreign"
    d.mkdir()
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "2", "-subj", "/CN=some-public-ca", cwd=d)
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=x",
             cwd=d)
    _openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "srv.crt", "-days", "2", "-extfile", "ext", cwd=d)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(d / "srv.crt", d / "srv.key")
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.2)
    stop = threading.Event()
    body = b'{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"kube-system"}}'

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            try:
                with ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.settimeout(2)
                    tls.recv(65536)
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                                + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            except (OSError, ssl.SSLError):
                pass  # a client that refused our certificate

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield sock.getsockname()[1], d / "ca.crt"
    finally:
        stop.set()
        t.join(2)
        sock.close()


async def test_only_the_kubeconfig_ca_is_trusted(
    foreign_tls_server: tuple[int, Path], kube: KubeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    reliability: Reliability,
) -> None:
    """A server certified by a CA of the system store, not by the kubeconfig's CA: both refuse it."""
    port, foreign_ca = foreign_tls_server
    cfg = _write(tmp_path / "kc.yaml", {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": f"https://127.0.0.1:{port}",
                                                "certificate-authority": str(kube.ca_file)}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    })
    # Both Python's default store and Go's read SSL_CERT_FILE: the foreign CA is "system-trusted" here.
    monkeypatch.setenv("SSL_CERT_FILE", str(foreign_ca))
    ours, why = await reloadd_ok(cfg)
    theirs, err = kubectl_ok(_env(SSL_CERT_FILE=str(foreign_ca)), "--kubeconfig", str(cfg), "get", "ns",
                             "kube-system")
    assert theirs is False and "x509" in err
    assert ours is False and "certificate" in why.lower(), why
    reliability.record("kube-manifests: server certified by a system-store CA the kubeconfig does not name",
                       trials=1, expected=0, delivered=int(ours),
                       notes=f"refused like kubectl v1.20.2 (`{err.strip().splitlines()[-1][:90]}`)")
    # Without a CA in the kubeconfig, the system store is what both trust.
    cluster = json.loads(cfg.read_text())
    del cluster["clusters"][0]["cluster"]["certificate-authority"]
    _write(cfg, cluster)
    theirs, err = kubectl_ok(_env(SSL_CERT_FILE=str(foreign_ca)), "--kubeconfig", str(cfg), "get", "--raw",
                             "/api/v1/namespaces/kube-system")
    ours, why = await reloadd_ok(cfg)
    assert theirs is True and ours is True, (err, why)


def _plugin(tmp_path: Path, status: dict[str, Any]) -> Path:
    plugin = tmp_path / "cred-plugin"
    plugin.write_text(
        f"#!{sys.executable}\nimport json, os\n"
        "assert json.loads(os.environ['KUBERNETES_EXEC_INFO'])['kind'] == 'ExecCredential'\n"
        f"print(json.dumps({{'apiVersion': 'client.authentication.k8s.io/v1beta1', 'kind': 'ExecCredential',"
        f" 'status': {status!r}}}))\n"
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    return plugin


@pytest.mark.parametrize("returns", ["token", "certificate"])
async def test_exec_plugin_like_kubectl(
    returns: str, kube: KubeCluster, tmp_path: Path, reliability: Reliability
) -> None:
    pki = kube.ca_file.parent
    if returns == "token":
        status: dict[str, Any] = {"token": kube.admin_token}
    else:
        status = {"clientCertificateData": (pki / "admin.crt").read_text(),
                  "clientKeyData": (pki / "admin.key").read_text()}
    _plugin(tmp_path, status)
    cfg = _write(tmp_path / "exec.kubeconfig", {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": kube.server, "certificate-authority-data": _ca_data(kube)}}],
        "users": [{"name": "u", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "./cred-plugin"}}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    })
    theirs, err = kubectl_ok(_env(), "--kubeconfig", str(cfg), "get", "ns", "kube-system")
    ours, why = await reloadd_ok(cfg)
    assert theirs is True, err
    assert ours is True, why
    reliability.record(f"kube-manifests: exec credential plugin returning a {returns}", trials=1, expected=1,
                       delivered=int(ours), notes=f"delivered = reloadd read kube-system with it; kubectl "
                                                  f"v1.20.2 {'did too' if theirs else 'did not'}")


def _files_holding(root: Path, text: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and text in p.read_text(errors="replace")]


async def test_inline_key_material_never_touches_the_filesystem(
    kube: KubeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reliability: Reliability
) -> None:
    """client-key-data is loaded without a temp file: it works even with no writable temp dir at all."""
    pki = kube.ca_file.parent
    cfg = _write(tmp_path / "inline.kubeconfig", {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": kube.server, "certificate-authority-data": _ca_data(kube)}}],
        "users": [{"name": "u", "user": {
            "client-certificate-data": base64.b64encode((pki / "admin.crt").read_bytes()).decode(),
            "client-key-data": base64.b64encode((pki / "admin.key").read_bytes()).decode()}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    })
    nowhere = tmp_path / "no-temp-dir-here"
    monkeypatch.setattr(tempfile, "tempdir", str(nowhere))
    monkeypatch.setenv("TMPDIR", str(nowhere))
    ours, why = await reloadd_ok(cfg)
    assert ours is True, why
    assert not nowhere.exists()
    # Any file under the test's directory holding a line of the key in clear (the kubeconfig holds base64).
    key_line = (pki / "admin.key").read_text().splitlines()[1]
    on_disk = _files_holding(tmp_path, key_line)
    assert on_disk == []
    theirs, err = kubectl_ok(_env(), "--kubeconfig", str(cfg), "get", "ns", "kube-system")
    assert theirs is True, err
    reliability.record("kube-manifests: inline client-key-data with no writable temp dir", trials=1, expected=0,
                       delivered=len(on_disk) + int(nowhere.exists()),
                       notes=f"delivered = key files left on disk; connected: {ours}, kubectl v1.20.2: {theirs}")


async def test_a_bad_exec_plugin_answer_is_named(kube: KubeCluster, tmp_path: Path) -> None:
    _plugin(tmp_path, {"expirationTimestamp": "2999-01-01T00:00:00Z"})
    cfg = _write(tmp_path / "exec.kubeconfig", {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": kube.server,
                                                "certificate-authority": str(kube.ca_file)}}],
        "users": [{"name": "u", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "./cred-plugin"}}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    })
    ours, why = await reloadd_ok(cfg)
    assert ours is False and "cred-plugin" in why and "neither status.token" in why, why


def _service_account(tmp_path: Path, kube: KubeCluster, monkeypatch: pytest.MonkeyPatch, token: str) -> Path:
    """A service-account directory and the in-cluster environment pointing at the real apiserver."""
    import shutil

    sa = tmp_path / "sa"
    sa.mkdir()
    shutil.copy(kube.ca_file, sa / "ca.crt")
    (sa / "token").write_text(token)
    (sa / "namespace").write_text("from-service-account\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(kube.port))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.kube/config unless a test writes one
    return sa


def _admin_kubeconfig(path: Path, kube: KubeCluster, namespace: str) -> Path:
    return _write(path, {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": kube.server, "certificate-authority-data": _ca_data(kube)}}],
        "users": [{"name": "u", "user": {"token": kube.admin_token}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": namespace}}],
    })


@pytest.mark.parametrize("where", ["KUBECONFIG", "home"])
async def test_a_kubeconfig_wins_over_the_in_cluster_service_account(
    where: str, kube: KubeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """client-go uses the in-cluster account only when no kubeconfig is found; a mounted one wins."""
    sa = _service_account(tmp_path, kube, monkeypatch, token="an-unknown-service-account-token")
    if where == "KUBECONFIG":
        cfg = _admin_kubeconfig(tmp_path / "kc" / "admin.yaml", kube, "from-kubeconfig")
        monkeypatch.setenv("KUBECONFIG", str(cfg))
    else:
        monkeypatch.delenv("KUBECONFIG", raising=False)
        _admin_kubeconfig(tmp_path / "home" / ".kube" / "config", kube, "from-kubeconfig")
    assert load_cluster_config(sa_dir=sa).namespace == "from-kubeconfig"
    ours, why = await reloadd_ok(None, sa_dir=sa)  # the service account's token would get a 401
    assert ours is True, why


async def test_in_cluster_only_when_no_kubeconfig_is_found(
    kube: KubeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Missing $KUBECONFIG files, or files that define nothing, leave the service account in charge."""
    sa = _service_account(tmp_path, kube, monkeypatch, token=kube.admin_token)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "missing.yaml"), str(empty)]))
    assert load_cluster_config(sa_dir=sa).namespace == "from-service-account"
    ours, why = await reloadd_ok(None, sa_dir=sa)
    assert ours is True, why
    # A set $KUBECONFIG replaces ~/.kube/config: the home file is not consulted.
    _admin_kubeconfig(tmp_path / "home" / ".kube" / "config", kube, "from-home")
    assert load_cluster_config(sa_dir=sa).namespace == "from-service-account"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(ConfigError, match=r"empty\.yaml"):  # no fallback left: the empty file is the error
        load_cluster_config(sa_dir=sa)


@pytest.mark.parametrize("ca", ["certificate-authority", "certificate-authority-data"])
async def test_insecure_skip_tls_verify_beside_a_ca_is_refused_like_kubectl(
    ca: str, kube: KubeCluster, tmp_path: Path
) -> None:
    cluster: dict[str, Any] = {"server": kube.server, "insecure-skip-tls-verify": True,
                               ca: str(kube.ca_file) if ca == "certificate-authority" else _ca_data(kube)}
    cfg = _write(tmp_path / "kc.yaml", {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": kube.admin_token}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    })
    with pytest.raises(ConfigError) as info:
        load_cluster_config(cfg)
    assert str(cfg) in str(info.value)
    assert "root certificates file with the insecure flag is not allowed" in str(info.value)
    theirs, err = kubectl_ok(_env(), "--kubeconfig", str(cfg), "get", "ns", "kube-system")
    assert theirs is False and "insecure flag is not allowed" in err, err
