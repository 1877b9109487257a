"""/metrics, /healthz and /readyz of an in-process Reloader with the real exec plugin on real inotify."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest
import yaml

import reloadd._ops._http
from reloadd import BaseConsumer, Batch, ConfigError, ConsumerContext, Reject, Reloader, Result, load_config
from reloadd._ops._http import parse_listen
from reloadd._ops._services import Services, services
from tests.daemon_config import write_config
from tests.waiting import until

from .support import Hook, http_get, sample, scrape

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def hook(tmp_path: Path) -> Hook:
    return Hook.make(tmp_path / "hook")


@pytest.fixture
def watched(tmp_path: Path) -> Path:
    d = tmp_path / "watched"
    d.mkdir()
    return d


def exec_config(tmp_path: Path, hook: Hook, watched: Path, **settings: object) -> Path:
    reloadd = {"state_dir": str(tmp_path / "state"), "quiet": "50ms", "max_delay": "1s",
               "metrics_listen": "127.0.0.1:0", **settings}
    return write_config(tmp_path / "reloadd.toml", reloadd,
                        [{"name": "hook", "plugin": "exec", "paths": [str(watched)],
                          "options": {"command": hook.command}}])


@pytest.fixture
async def running(tmp_path: Path, hook: Hook, watched: Path) -> AsyncIterator[tuple[Reloader, Services, str]]:
    r = Reloader(load_config(exec_config(tmp_path, hook, watched)))
    async with services(r) as svc, r:
        assert svc.metrics_url is not None
        await r.wait_idle(10)
        yield r, svc, svc.metrics_url.removesuffix("/metrics")


async def test_metrics_follow_success_retry_and_recovery(
    running: tuple[Reloader, Services, str], hook: Hook, watched: Path
) -> None:
    r, _, base = running
    status, headers, _ = await http_get(base + "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    m = await scrape(base)
    assert sample(m, "reloadd_build_info", version=reloadd_version(), python=python_version()) == 1
    assert sample(m, "reloadd_ready") == 1
    assert sample(m, "reloadd_watch_armed") == 1
    assert (sample(m, "reloadd_watches") or 0) >= 1
    assert (sample(m, "reloadd_rescan_duration_seconds_count") or 0) >= 1  # the start-up pass
    covered = sample(m, "reloadd_rescans_covered_total")
    assert covered is not None and covered < sample(m, "reloadd_rescan_duration_seconds_count")  # start-up: full
    assert sample(m, "reloadd_consumer_info", consumer="hook", plugin="reloadd_exec") == 1

    # success
    before = time.time()
    (watched / "a.txt").write_text("one")
    await until(lambda: _has(base, "reloadd_consumer_results_total", 1, consumer="hook", outcome="success"),
                what="one success")
    m = await scrape(base)
    assert sample(m, "reloadd_consumer_batches_total", consumer="hook") == 1
    assert (sample(m, "reloadd_events_total", source="inotify", kind="written") or 0) >= 1
    assert (sample(m, "reloadd_changes_handed_over_total") or 0) >= 1
    assert sample(m, "reloadd_consumer_stat", consumer="hook", name="runs") == 1
    assert (sample(m, "reloadd_consumer_last_success_timestamp_seconds", consumer="hook") or 0) >= before - 1
    assert sample(m, "reloadd_consumer_queue_depth", consumer="hook") == 0
    assert [c["path"] for b in hook.calls() for c in b["changes"]] == [str(watched / "a.txt")]

    # failure -> retry with backoff: the path waits, its age grows, the plugin's failure counter moves
    hook.fail(3, "registry unreachable")
    (watched / "b.txt").write_text("two")
    await until(lambda: _has(base, "reloadd_consumer_results_total", 1, consumer="hook", outcome="retry"),
                what="a retry")
    m = await scrape(base)
    assert sample(m, "reloadd_consumer_failing_paths", consumer="hook") == 1
    assert sample(m, "reloadd_consumer_queue_depth", consumer="hook") == 1
    assert (sample(m, "reloadd_consumer_stat", consumer="hook", name="failures") or 0) >= 1
    assert (sample(m, "reloadd_consumer_oldest_pending_age_seconds", consumer="hook") or 0) > 0
    assert sample(m, "reloadd_consumer_results_total", consumer="hook", outcome="success") == 1

    # recovery: the retry succeeds, the queue drains
    hook.succeed()
    await r.wait_idle(15)
    m = await scrape(base)
    assert sample(m, "reloadd_consumer_results_total", consumer="hook", outcome="success") == 2
    assert sample(m, "reloadd_consumer_failing_paths", consumer="hook") == 0
    assert sample(m, "reloadd_consumer_queue_depth", consumer="hook") == 0
    assert sample(m, "reloadd_consumer_oldest_pending_age_seconds", consumer="hook") == 0
    assert sample(m, "reloadd_consumer_results_total", consumer="hook", outcome="failure") == 0


async def test_bursts_are_counted_as_coalesced(running: tuple[Reloader, Services, str], watched: Path) -> None:
    r, _, base = running
    m0 = await scrape(base)
    _burst(watched / "burst.txt")
    await until(lambda: _has(base, "reloadd_consumer_batches_total", 1, consumer="hook"), what="a batch")
    await r.wait_idle(10)
    m = await scrape(base)
    assert (sample(m, "reloadd_changes_coalesced_total") or 0) > (sample(m0, "reloadd_changes_coalesced_total") or 0)
    assert sample(m, "reloadd_consumer_batches_total", consumer="hook") == 1


async def test_identical_content_is_counted_as_unchanged(
    running: tuple[Reloader, Services, str], watched: Path
) -> None:
    r, _, base = running
    (watched / "same.txt").write_text("x")
    await until(lambda: _has(base, "reloadd_consumer_batches_total", 1, consumer="hook"), what="a batch")
    (watched / "same.txt").write_text("x")  # new mtime, same bytes
    await until(lambda: _has(base, "reloadd_consumer_changes_unchanged_total", 1, consumer="hook"),
                what="the rewrite dropped as unchanged")
    await r.wait_idle(10)
    m = await scrape(base)
    assert sample(m, "reloadd_consumer_batches_total", consumer="hook") == 1


class Rejecter(BaseConsumer):
    """Rejects every path (a permanent failure) and keeps a plugin counter."""

    def __init__(self, root: Path) -> None:
        super().__init__(ConsumerContext(name="strict", paths=(root,), options={}, state_dir=root))
        self.stats = {"objects_applied": 0.0, "bytes_imported": 1.5e9,
                      # metric{label=value}: a family of its own (containerd-images' refusals, issue #60)
                      "manifests_refused_total{reason=invalid}": 3.0, "queue_bytes{kind=ours}": 7.0}

    async def handle(self, batch: Batch) -> Mapping[Path, Result]:
        return {c.path: Reject(f"{c.path.name}: not a valid manifest") for c in batch.changes}


async def test_permanent_failures_and_plugin_stats(tmp_path: Path, watched: Path) -> None:
    cfg = load_config(write_config(tmp_path / "r.toml", {"state_dir": str(tmp_path / "state"), "quiet": "50ms",
                                                         "metrics_listen": "127.0.0.1:0"}, []))
    r = Reloader(cfg, consumers=[Rejecter(watched)])
    async with services(r) as svc, r:
        base = (svc.metrics_url or "").removesuffix("/metrics")
        (watched / "bad.yaml").write_text("{")
        await until(lambda: _has(base, "reloadd_consumer_results_total", 1, consumer="strict",
                                      outcome="failure"), what="a rejection")
        await r.wait_idle(10)
        m = await scrape(base)
        assert sample(m, "reloadd_consumer_results_total", consumer="strict", outcome="failure") == 1
        assert sample(m, "reloadd_consumer_rejected_paths", consumer="strict") == 1
        assert sample(m, "reloadd_consumer_queue_depth", consumer="strict") == 0  # not retried
        assert sample(m, "reloadd_consumer_stat", consumer="strict", name="bytes_imported") == 1.5e9
        assert sample(m, "reloadd_manifests_refused_total", consumer="strict", reason="invalid") == 3
        assert sample(m, "reloadd_queue_bytes", consumer="strict", kind="ours") == 7
        own = "manifests_refused_total{reason=invalid}"
        assert sample(m, "reloadd_consumer_stat", consumer="strict", name=own) is None  # not exported twice
        assert sample(m, "reloadd_consumer_last_success_timestamp_seconds", consumer="strict") == 0


class Gated(BaseConsumer):
    """Acks once ``gate`` is set."""

    def __init__(self, root: Path) -> None:
        super().__init__(ConsumerContext(name="gated", paths=(root,), options={}, state_dir=root))
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def handle(self, batch: Batch) -> Mapping[Path, Result]:
        self.entered.set()
        await self.gate.wait()
        return {}


async def test_a_prune_hold_is_counted_and_alerted_on_while_readyz_stays_ready(
    running: tuple[Reloader, Services, str], watched: Path
) -> None:
    r, _, base = running
    for i in range(3):
        (watched / f"f{i}.conf").write_text(str(i))
    await until(lambda: len(r.engine.slots["hook"].records) == 3, what="3 files acknowledged")
    await r.wait_idle(10)
    shutil.rmtree(watched)
    os.mkdir(watched)  # emptied in one step: held
    await until(lambda: len(r.status()["consumers"]["hook"]["prune_held"]) == 3, what="3 removals held")
    m = await scrape(base)
    assert sample(m, "reloadd_prune_held", consumer="hook") == 3
    assert sample(m, "reloadd_prune_held_paths", consumer="hook") == 3
    assert (await http_get(base + "/readyz"))[0] == 200, "a hold keeps the node on its last good state: ready"
    rules = yaml.safe_load((Path(__file__).parents[2] / "examples/prometheus/reloadd-alerts.yaml").read_text())
    exported = {name for name, _ in m}
    for rule in rules["groups"][0]["rules"]:
        used = set(re.findall(r"\breloadd_[a-z_]+", rule["expr"]))
        assert used and used <= exported, (rule["alert"], used - exported)


async def test_every_metric_the_dashboard_and_alerts_query_is_exported(
    running: tuple[Reloader, Services, str]
) -> None:
    """examples/grafana and examples/prometheus query only what the daemon declares (a renamed metric breaks here)."""
    _r, _, base = running
    status, _, body = await http_get(base + "/metrics")
    assert status == 200
    declared: set[str] = set()
    for line in body.decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            declared |= {name, f"{name}_total"} if kind == "counter" else {name}
    root = Path(__file__).parents[2] / "examples"
    dashboard = json.loads((root / "grafana/reloadd-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = yaml.safe_load((root / "prometheus/reloadd-alerts.yaml").read_text())
    exprs += [rule["expr"] for rule in rules["groups"][0]["rules"]]
    used = {m for e in exprs for m in re.findall(r"\b(?:reloadd|process)_[a-z_]+", e)}
    assert {"reloadd_leader", "reloadd_drift_total", "reloadd_drifted_paths", "reloadd_prune_held_paths"} <= used
    assert used - declared == set(), used - declared


async def test_readyz_turns_ready_only_after_the_initial_pass(tmp_path: Path, watched: Path) -> None:
    (watched / "present-at-start.txt").write_text("x")
    cfg = load_config(write_config(tmp_path / "r.toml", {"state_dir": str(tmp_path / "state"), "quiet": "50ms",
                                                         "metrics_listen": "127.0.0.1:0"}, []))
    consumer = Gated(watched)
    r = Reloader(cfg, consumers=[consumer])
    async with services(r) as svc:
        base = (svc.metrics_url or "").removesuffix("/metrics")
        status, _, body = await http_get(base + "/readyz")  # not started: unready, but answering
        assert status == 503 and b"initial pass not done" in body
        async with r:
            await asyncio.wait_for(consumer.entered.wait(), 10)  # the initial pass is under way
            status, _, body = await http_get(base + "/readyz")
            assert status == 503 and b"initial pass not done" in body
            assert (await http_get(base + "/healthz"))[0] == 200
            assert sample(await scrape(base), "reloadd_ready") == 0
            consumer.gate.set()
            await r.wait_idle(10)
            status, _, body = await http_get(base + "/readyz")
            assert status == 200, body
            assert sample(await scrape(base), "reloadd_ready") == 1


async def test_readyz_fails_when_a_path_waits_beyond_ready_max_age(
    tmp_path: Path, hook: Hook, watched: Path
) -> None:
    hook.fail(1, "containerd is down")
    (watched / "stuck.tar").write_text("x")
    r = Reloader(load_config(exec_config(tmp_path, hook, watched, ready_max_age="3s")))
    async with services(r) as svc, r:
        base = (svc.metrics_url or "").removesuffix("/metrics")
        # the initial pass was attempted: a bad file alone does not hold readiness back...
        await until(lambda: _status(base + "/readyz", 200), what="ready after the first attempt")
        # ...but a path that keeps waiting does
        await until(lambda: _status(base + "/readyz", 503), what="unready once stuck")
        _, _, body = await http_get(base + "/readyz")
        assert b"consumer hook: a path has waited" in body
        hook.succeed()
        await r.wait_idle(15)
        assert (await http_get(base + "/readyz"))[0] == 200


async def test_healthz_fails_on_a_stalled_loop_and_a_dead_engine(
    running: tuple[Reloader, Services, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    r, _, base = running
    status, _, body = await http_get(base + "/healthz")
    assert status == 200, body
    monkeypatch.setattr(reloadd._ops._http, "MAX_LOOP_LAG", 0.3)
    time.sleep(reloadd._ops._http.LOOP_TICK + 1.0)  # a tick falls due in it, and is run over a second late
    status, _, body = await http_get(base + "/healthz")
    assert status == 503 and b"event loop woke" in body
    lag = sample(await scrape(base), "reloadd_event_loop_lag_seconds")
    assert lag is not None
    await until(lambda: _status(base + "/healthz", 200), what="healthy again")

    pump = next(t for t in r._tasks if t.get_name() == "reloadd-pump")
    pump.cancel()
    await asyncio.gather(pump, return_exceptions=True)
    status, _, body = await http_get(base + "/healthz")
    assert status == 503 and b"reloadd-pump" in body


async def test_unknown_paths_and_methods(running: tuple[Reloader, Services, str]) -> None:
    _, _, base = running
    assert (await http_get(base + "/nope"))[0] == 404
    host, port = base.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await reader.read()).startswith(b"HTTP/1.1 405")
    writer.close()


async def test_openmetrics_is_negotiated(running: tuple[Reloader, Services, str]) -> None:
    _, _, base = running
    status, headers, body = await http_get(base + "/metrics", accept="application/openmetrics-text")
    assert status == 200 and headers["content-type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


def test_listen_address_needs_an_explicit_host() -> None:
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("[::1]:9464") == ("::1", 9464)
    with pytest.raises(ConfigError, match=r"0\.0\.0\.0:9464 for every interface"):
        parse_listen(":9464")
    with pytest.raises(ConfigError):
        parse_listen("localhost")


async def test_loopback_listener_binds_loopback_only(running: tuple[Reloader, Services, str]) -> None:
    _, svc, _ = running
    assert svc.http_address is not None and svc.http_address[0] == "127.0.0.1"


async def test_nothing_is_served_unless_configured(tmp_path: Path, watched: Path) -> None:
    cfg = load_config(write_config(tmp_path / "r.toml", {"state_dir": str(tmp_path / "state")}, []))
    r = Reloader(cfg, consumers=[Gated(watched)])
    async with services(r, notify_socket="") as svc:
        assert svc.http_address is None and svc.control_socket is None and not svc.notifier.enabled


def _burst(path: Path) -> None:
    """One writer, many writes: one settled change."""
    with open(path, "w") as f:
        for i in range(50):
            f.write(f"{i}\n")
            f.flush()


async def _has(base: str, metric: str, value: float, /, **labels: str) -> bool:
    return sample(await scrape(base), metric, **labels) == value


async def _status(url: str, code: int) -> bool:
    return (await http_get(url))[0] == code


def reloadd_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("reloadd")


def python_version() -> str:
    import platform

    return platform.python_version()
