"""The REST layer: retries (injected 429/503 from a fake server, since a real one will not produce them on
demand) and every kubeconfig flavour against the real kube-apiserver."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from reloadd_kube_manifests import ApiError, ApiUnavailable, KubeClient, RequestDropped, load_cluster_config
from reloadd_kube_manifests._kubeconfig import TokenAuth

from reloadd import ConfigError

from .support import KubeCluster

pytestmark = pytest.mark.timeout(60)


class Recorder:
    """An injected sleep that records the delays instead of waiting them out."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


@pytest.fixture
async def fake_server() -> AsyncIterator[Callable[[list[Any]], Any]]:
    """``await start(script)``: a server answering each request with the next scripted step."""
    runners: list[web.AppRunner] = []

    async def start(script: list[Any]) -> tuple[str, list[web.Request]]:
        seen: list[web.Request] = []

        async def handler(request: web.Request) -> web.StreamResponse:
            seen.append(request)
            step = script.pop(0)
            if step == "disconnect":
                assert request.transport is not None
                request.transport.close()
                return web.Response()
            status, headers, body = step
            return web.Response(status=status, headers=headers, text=json.dumps(body))

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}", seen

    yield start
    for r in runners:
        await r.cleanup()


def status(code: int, reason: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code,
            "message": reason}


# The answer to the client's /version probe after a dropped connection.
VERSION: tuple[int, dict[str, str], dict[str, str]] = (200, {}, {"gitVersion": "v1.20.2"})


def client_for(url: str, sleep: Recorder, **kw: Any) -> KubeClient:
    from reloadd_kube_manifests import ClusterConfig

    return KubeClient(ClusterConfig(url, None, TokenAuth("t")), sleep=sleep, **kw)


async def test_503_and_429_are_retried_honouring_retry_after(fake_server: Any) -> None:
    url, seen = await fake_server([
        (503, {"Retry-After": "2"}, status(503, "ServiceUnavailable")),
        (429, {"Retry-After": "1"}, status(429, "TooManyRequests")),
        "disconnect",
        VERSION,
        (200, {}, {"kind": "ConfigMap", "metadata": {"name": "x"}}),
    ])
    sleep = Recorder()
    client = client_for(url, sleep)
    try:
        body = await client.apply("/api/v1/namespaces/d/configmaps/x", {"kind": "ConfigMap"},
                                  manager="reloadd", force=True, dry_run=False)
    finally:
        await client.close()
    assert body["metadata"]["name"] == "x"
    assert sleep.delays[:2] == [2.0, 1.0]
    # No Retry-After on a dropped connection: exponential backoff, 0.2 s x 2^2 with ±50 % jitter.
    assert len(sleep.delays) == 3 and 0.4 <= sleep.delays[2] <= 1.2
    assert [r.method for r in seen] == ["PATCH", "PATCH", "PATCH", "GET", "PATCH"]
    assert seen[0].headers["Content-Type"] == "application/apply-patch+yaml"
    assert seen[0].query["fieldManager"] == "reloadd" and seen[0].query["force"] == "true"


async def test_retries_give_up_as_a_transient_error_and_cap_retry_after(fake_server: Any) -> None:
    url, seen = await fake_server([(503, {"Retry-After": "3600"}, status(503, "ServiceUnavailable"))] * 3)
    sleep = Recorder()
    client = client_for(url, sleep, attempts=3, max_delay=5.0)
    try:
        with pytest.raises(ApiUnavailable, match="gave up after 3 attempts"):
            await client.get("/api/v1/namespaces")
    finally:
        await client.close()
    assert sleep.delays == [5.0, 5.0]
    assert len(seen) == 3


async def test_a_request_the_server_keeps_dropping_is_refused_after_three_drops(fake_server: Any) -> None:
    # The real v1.20.2 server drops the connection on an APIService apply (a handler panic); only a fake
    # server can say exactly how many requests reached it. Each drop is followed by a GET /version probe.
    url, seen = await fake_server(["disconnect", VERSION] * 6)
    sleep = Recorder()
    client = client_for(url, sleep)
    try:
        with pytest.raises(RequestDropped, match=r"dropped the connection 3 times in a row: .*Server disconnected"):
            await client.apply("/apis/x/v1/things/t", {"kind": "Thing"}, manager="reloadd", force=True,
                               dry_run=False)
    finally:
        await client.close()
    assert [r.method for r in seen] == ["PATCH", "GET"] * 3
    assert {r.path for r in seen if r.method == "GET"} == {"/version"}
    assert len(sleep.delays) == 2 and all(d <= 0.6 for d in sleep.delays)


async def test_drops_interrupted_by_an_answer_stay_transient(fake_server: Any) -> None:
    overloaded = (503, {"Retry-After": "1"}, status(503, "ServiceUnavailable"))
    url, seen = await fake_server(["disconnect", VERSION, "disconnect", VERSION, overloaded] * 2)
    client = client_for(url, Recorder())
    try:
        with pytest.raises(ApiUnavailable, match="gave up after 6 attempts"):
            await client.apply("/apis/x/v1/things/t", {"kind": "Thing"}, manager="reloadd", force=True,
                               dry_run=False)
    finally:
        await client.close()
    assert [r.method for r in seen].count("PATCH") == 6


async def test_a_drop_while_the_server_is_down_is_not_held_against_the_request() -> None:
    # A killed or restarting server (or a load balancer with no backend) drops connections too: the
    # /version probe fails then, and the drop does not count.
    state = {"patches": 0, "down": False}

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.method == "PATCH":
            state["patches"] += 1
            state["down"] = state["patches"] == 1  # down after the first drop, back for the next ones
            if state["patches"] <= 3:
                assert request.transport is not None
                request.transport.close()
                return web.Response()
            return web.json_response({"kind": "Thing"})
        if state["down"]:
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        return web.json_response(VERSION[2])

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    client = client_for(f"http://127.0.0.1:{runner.addresses[0][1]}", Recorder())
    try:
        body = await client.apply("/apis/x/v1/things/t", {"kind": "Thing"}, manager="reloadd", force=True,
                                  dry_run=False)
        refused = client_for("http://127.0.0.1:9", Recorder(), attempts=4)  # nothing listens: never connected
        with pytest.raises(ApiUnavailable, match="gave up after 4 attempts"):
            await refused.get("/api/v1/namespaces")
        await refused.close()
    finally:
        await client.close()
        await runner.cleanup()
    assert body == {"kind": "Thing"}
    assert state["patches"] == 4 and client.stats["dropped"] == 2


async def test_client_errors_are_not_retried_and_plain_404_is_flagged(fake_server: Any) -> None:
    url, seen = await fake_server([(422, {}, status(422, "Invalid"))])
    client = client_for(url, Recorder())
    try:
        with pytest.raises(ApiError) as info:
            await client.get("/x")
    finally:
        await client.close()
    assert info.value.status == 422 and info.value.reason == "Invalid" and not info.value.plain
    assert len(seen) == 1


async def test_not_served_group_version_is_a_plain_text_404(kube: KubeCluster) -> None:
    client = KubeClient(load_cluster_config(kube.kubeconfig))
    try:
        with pytest.raises(ApiError) as info:
            await client.get("/apis/nothing.example.com/v1")
    finally:
        await client.close()
    assert info.value.not_served and "404 page not found" in info.value.message


async def whoami(config_path: Path | None = None, **kw: Any) -> int:
    client = KubeClient(load_cluster_config(config_path, **kw))
    try:
        body = await client.get("/api/v1/namespaces/kube-system")
    finally:
        await client.close()
    return len(body["metadata"]["name"])


async def test_client_certificate_kubeconfig(kube: KubeCluster) -> None:
    assert await whoami(kube.cert_kubeconfig) == len("kube-system")


async def test_inline_data_and_exec_plugin_kubeconfig(kube: KubeCluster, tmp_path: Path) -> None:
    import base64

    plugin = tmp_path / "cred-plugin"
    plugin.write_text(
        f"#!{sys.executable}\nimport json, os\n"
        "assert json.loads(os.environ['KUBERNETES_EXEC_INFO'])['kind'] == 'ExecCredential'\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', 'kind': 'ExecCredential',"
        f" 'status': {{'token': os.environ['TOKEN'], 'expirationTimestamp': '2999-01-01T00:00:00Z'}}}}))\n"
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {
            "server": kube.server,
            "certificate-authority-data": base64.b64encode(kube.ca_file.read_bytes()).decode()}}],
        "users": [{"name": "u", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": "./cred-plugin",
            "env": [{"name": "TOKEN", "value": kube.admin_token}]}}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "apps"}}],
    }
    path = tmp_path / "exec.kubeconfig"
    path.write_text(json.dumps(cfg))
    assert load_cluster_config(path).namespace == "apps"
    assert await whoami(path) == len("kube-system")


async def test_in_cluster_service_account_token_is_reread_after_rotation(
    kube: KubeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    shutil.copy(kube.ca_file, sa / "ca.crt")
    (sa / "token").write_text("stale-token")
    (sa / "namespace").write_text("tenant\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(kube.port))
    # In-cluster config is the fallback when no kubeconfig is found (client-go's order): make sure none is.
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = load_cluster_config(sa_dir=sa)
    assert config.namespace == "tenant"
    client = KubeClient(config)
    try:
        with pytest.raises(ApiError) as info:
            await client.get("/api/v1/namespaces/kube-system")
        assert info.value.status == 401
        (sa / "token").write_text(kube.admin_token)  # kubelet rotated the projected token
        os.utime(sa / "token", ns=(1, 1))
        body = await client.get("/api/v1/namespaces/kube-system")
    finally:
        await client.close()
    assert body["metadata"]["name"] == "kube-system"


def test_missing_kubeconfig_context_is_a_config_error(kube: KubeCluster) -> None:
    with pytest.raises(ConfigError, match="no context named 'nope'"):
        load_cluster_config(kube.kubeconfig, context="nope")


async def test_token_file_and_insecure_skip_tls_verify(kube: KubeCluster, tmp_path: Path) -> None:
    (tmp_path / "token").write_text(kube.admin_token + "\n")
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": kube.server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"tokenFile": "token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }
    path = tmp_path / "kc.yaml"
    path.write_text(json.dumps(cfg))
    assert await whoami(path) == len("kube-system")


def test_auth_provider_is_refused_with_a_hint(tmp_path: Path) -> None:
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"auth-provider": {"name": "gcp"}}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }
    path = tmp_path / "kc.yaml"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="auth-provider is not supported; use an exec plugin"):
        load_cluster_config(path)
