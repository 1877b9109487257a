"""Faults seen with real-world manifests, reproduced against the real kube-apiserver v1.20.2.

* an aggregated API whose backend is down (an APIService answering 503) must only hold back its own objects;
* a request that crashes the server's handler (SSA of an APIService panics v1.20.2 and drops the
  connection) must become a Reject after a few tries, not be retried forever;
* the server's ``Warning:`` headers (deprecated APIs) must be reported once per file content;
* a file that is partly applied must say so, listing each failing object in document order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from reloadd_kube_manifests import parent_name

import reloadd
from reloadd import Ack, Reject, Retry
from tests.waiting import until

from .support import Harness, KubeCluster, cm
from .test_km_reloader import write_atomic

pytestmark = pytest.mark.timeout(120)

METRICS_GV = "/apis/metrics.k8s.io/v1beta1"
APISERVICES = "/apis/apiregistration.k8s.io/v1/apiservices"


def cm_path(ns: str, name: str) -> str:
    return f"/api/v1/namespaces/{ns}/configmaps/{name}"


def apiservice(name: str, group: str, version: str) -> dict[str, Any]:
    """An APIService whose backing Service does not exist, as when metrics-server is down."""
    return {
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": name},
        "spec": {"group": group, "version": version, "groupPriorityMinimum": 100, "versionPriority": 100,
                 "insecureSkipTLSVerify": True,
                 "service": {"namespace": "kube-system", "name": "metrics-server", "port": 443}},
    }


@pytest.fixture
async def metrics_api_down(kube: KubeCluster) -> AsyncIterator[None]:
    """``v1beta1.metrics.k8s.io`` registered with no backend: the aggregator answers 503 for it."""
    name = "v1beta1.metrics.k8s.io"
    # POST, not server-side apply: an apply of an APIService crashes the v1.20.2 handler (see below).
    status, body = kube.request("POST", APISERVICES, apiservice(name, "metrics.k8s.io", "v1beta1"))
    assert status == 201, body
    try:
        await until(lambda: kube.request("GET", METRICS_GV)[0] == 503, what="the aggregator to answer 503")
        yield
    finally:
        kube.request("DELETE", f"{APISERVICES}/{name}")
        await until(lambda: kube.request("GET", METRICS_GV)[0] == 404, what="the APIService to go away")


async def test_unavailable_aggregated_api_holds_back_only_its_own_objects(
    metrics_api_down: None, make_harness: Any, kube: KubeCluster, namespace: str
) -> None:
    h: Harness = await make_harness()  # a fresh consumer: its first batch runs discovery, as after a restart
    plain = h.write("plain.yaml", [cm("plain-1", namespace), cm("plain-2", namespace)])
    mixed = h.write("mixed.yaml", [
        cm("beside-metrics", namespace),
        {"apiVersion": "metrics.k8s.io/v1beta1", "kind": "PodMetrics",
         "metadata": {"name": "m", "namespace": namespace}},
    ])
    started = time.monotonic()
    results = await h.sync(plain, mixed)
    took = time.monotonic() - started
    assert isinstance(results[plain], Ack), results[plain]
    assert took < 2.0, f"ordinary manifests took {took:.2f}s"
    assert kube.get(cm_path(namespace, "plain-1")) is not None
    assert kube.get(cm_path(namespace, "beside-metrics")) is not None
    waiting = results[mixed]
    assert isinstance(waiting, Retry), waiting
    assert "doc 2 (line 3) PodMetrics" in waiting.error
    assert "metrics.k8s.io/v1beta1 is unavailable (503 service unavailable)" in waiting.error

    # Pruning never forgets objects of the unavailable API: the parent keeps the PodMetrics in its inventory.
    h.write("mixed.yaml", [cm("beside-metrics", namespace)])
    again = (await h.sync(mixed))[mixed]
    assert isinstance(again, Retry), again
    assert f"prune: cannot check metrics.k8s.io/PodMetrics/{namespace}/m" in again.error
    inventory = kube.get(cm_path("kube-system", parent_name(h.consumer.key(mixed))))["data"]["inventory"]
    assert f"metrics.k8s.io/PodMetrics/{namespace}/m\n" in inventory


async def test_daemon_start_with_an_unavailable_aggregated_api_applies_the_rest_at_once(
    metrics_api_down: None, kube: KubeCluster, tmp_path: Path, namespace: str
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    write_atomic(manifests / "plain.yaml", [cm("boot-1", namespace), cm("boot-2", namespace)])
    metrics = manifests / "metrics.yaml"
    write_atomic(metrics, [{"apiVersion": "metrics.k8s.io/v1beta1", "kind": "NodeMetrics", "metadata": {"name": "n"}}])
    cfg = reloadd.parse_config({
        "reloadd": {"state_dir": str(tmp_path / "state"), "quiet": "50ms"},
        "consumer": [{"name": "manifests", "plugin": "kube-manifests", "paths": [str(manifests)],
                      "options": {"kubeconfig": str(kube.kubeconfig)}}],
    })
    started = time.monotonic()
    async with reloadd.Reloader(cfg) as r:
        await until(lambda: kube.get(cm_path(namespace, "boot-2")) is not None, what="the ordinary manifests")
        took = time.monotonic() - started

        def waiting() -> list[dict[str, Any]]:
            failing = r.status()["consumers"]["manifests"]["failing"]
            return [f for f in failing if f["path"] == str(metrics)]

        await until(lambda: bool(waiting()), what="the metrics object to wait for its API")
        assert "doc 1 (line 1) NodeMetrics n: waiting for its API: " in waiting()[0]["error"]
        assert "metrics.k8s.io/v1beta1 is unavailable (503 service unavailable)" in waiting()[0]["error"]
    assert took < 2.0, f"the ordinary manifests took {took:.2f}s from start"

    # A restart with the same state, the API still down: what changed meanwhile is applied at once.
    write_atomic(manifests / "plain.yaml", [cm("boot-1", namespace, v="2"), cm("boot-2", namespace)])
    write_atomic(manifests / "added.yaml", [cm("boot-3", namespace)])
    started = time.monotonic()
    async with reloadd.Reloader(cfg):
        await until(lambda: kube.get(cm_path(namespace, "boot-3")) is not None
                         and (kube.get(cm_path(namespace, "boot-1")) or {}).get("data") == {"v": "2"},
                    what="the changes made while stopped")
        took = time.monotonic() - started
    assert took < 2.0, f"after the restart the changed manifests took {took:.2f}s"


async def test_request_that_crashes_the_server_is_rejected_after_three_drops(
    make_harness: Any, kube: KubeCluster, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    h: Harness = await make_harness()
    warm = h.write("warm.yaml", [cm("warm", namespace)])
    assert isinstance((await h.sync(warm))[warm], Ack)  # discovery done: count only the file's requests
    f = h.write("metrics-apiservice.yaml", [
        cm("beside-apiservice", namespace),
        apiservice("v1beta1.crash.example.com", "crash.example.com", "v1beta1"),
    ])
    client = h.consumer.client
    assert client is not None
    before = client.stats["requests"]
    caplog.set_level(logging.DEBUG, logger="reloadd")
    res = (await h.sync(f))[f]
    assert isinstance(res, Reject), res
    assert "doc 2 (line 3) APIService v1beta1.crash.example.com" in res.error
    assert "the server dropped the connection 3 times in a row" in res.error
    assert "Server disconnected" in res.error
    assert client.stats["dropped"] == 3
    # parent read + widen + ConfigMap + 3 x (crashing apply + /version probe) + parent write + Event = 11
    assert client.stats["requests"] - before <= 11, "the poisoned request was retried too often"
    assert kube.get(cm_path(namespace, "beside-apiservice")) is not None
    loud = [r for r in caplog.records if r.levelno >= logging.INFO and r.exc_info]
    assert not loud, "expected failures must not log a traceback above DEBUG"
    # The consumer logs it at DEBUG: the one WARNING line per failure is the engine's, with this Reject's text
    # (test_km_reloader.py::test_an_expected_failure_is_one_warning_line).
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and str(f) in r.getMessage()]
    assert [r for r in caplog.records if r.levelno == logging.DEBUG and "dropped the connection" in r.getMessage()]

    # SIGHUP (a forced pass) tries it again, with the same bound.
    res = (await h.sync(f, forced=True))[f]
    assert isinstance(res, Reject) and "dropped the connection" in res.error
    assert client.stats["dropped"] == 6


async def test_deprecation_warnings_are_reported_once_per_file_content(
    make_harness: Any, kube: KubeCluster, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    h: Harness = await make_harness()
    role = {"apiVersion": "rbac.authorization.k8s.io/v1beta1", "kind": "Role",
            "metadata": {"name": "old-role", "namespace": namespace}, "rules": []}
    f = h.write("old-api.yaml", [cm("modern", namespace), role])
    caplog.set_level(logging.INFO, logger="reloadd")
    res = (await h.sync(f))[f]
    assert isinstance(res, Ack), res
    assert isinstance(res.data, dict)
    expected = ("doc 2 (line 3) Role " + namespace + "/old-role: rbac.authorization.k8s.io/v1beta1 Role is "
                "deprecated in v1.17+, unavailable in v1.22+; use rbac.authorization.k8s.io/v1 Role")
    assert res.data["warnings"] == [expected]

    def warned() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.levelno == logging.WARNING and "deprecated" in r.getMessage()]

    [line] = warned()
    assert str(f) in line.getMessage() and expected in line.getMessage()
    parent = res.data["parent"].split("/")[1]

    def events() -> list[dict[str, Any]]:
        body = kube.get(f"/api/v1/namespaces/kube-system/events?fieldSelector=involvedObject.name={parent}")
        return [e for e in body["items"] if e["reason"] == "ApplyWarning"]

    [event] = events()
    assert event["type"] == "Warning" and expected in event["message"]

    # The same content again (a forced pass) applies it again, but does not repeat the report.
    res = (await h.sync(f, forced=True))[f]
    assert isinstance(res, Ack) and res.data["warnings"] == [expected]
    assert len(warned()) == 1 and len(events()) == 1
    # New content is reported anew.
    h.write("old-api.yaml", [cm("modern", namespace, v="2"), role])
    res = (await h.sync(f))[f]
    assert isinstance(res, Ack)
    assert len(warned()) == 2 and len(events()) == 2


async def test_partly_failing_file_lists_each_failure_in_document_order(
    make_harness: Any, kube: KubeCluster, namespace: str
) -> None:
    h: Harness = await make_harness()
    objs = [cm("ok-1", namespace), cm("Bad_One", namespace), cm("ok-2", namespace),
            cm("waits", f"{h.name}-missing"), cm("Bad_Two", namespace)]
    f = h.write("partly.yaml", objs)
    res = (await h.sync(f))[f]
    assert isinstance(res, Retry), res  # the missing namespace may appear: the file is retried
    assert res.error.startswith("partially applied (2 of 5 objects): doc 2 (line 3) ConfigMap")
    docs = [res.error.index(f"doc {n} (line {2 * n - 1}) ConfigMap") for n in (2, 4, 5)]
    assert docs == sorted(docs), res.error
    assert "Bad_One" in res.error and "Bad_Two" in res.error and "-missing" in res.error

    h.write("partly.yaml", [o for o in objs if o["metadata"]["name"] != "waits"])
    res = (await h.sync(f))[f]
    assert isinstance(res, Reject), res
    assert res.error.startswith("partially applied (2 of 4 objects): doc 2 (line 3) ConfigMap")
    assert isinstance(res.data, dict) and res.data["partial"] is True and res.data["objects"] == 4
    assert [e.split(" ConfigMap")[0] for e in res.data["errors"]] == ["doc 2 (line 3)", "doc 4 (line 7)"]
    assert kube.get(cm_path(namespace, "ok-2")) is not None
