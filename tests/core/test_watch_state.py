"""One watch state, read alike by status, /readyz, /healthz, the metrics and systemd's STATUS line."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from reloadd import Reloader, Watch, WatchState
from reloadd._ops._http import Health, LoopMonitor
from reloadd._ops._metrics import build_registry
from reloadd._ops._services import status_line

from ..conftest import config_for

pytestmark = pytest.mark.timeout(30)


def views(r: Reloader) -> dict[str, object]:
    health = Health(r, LoopMonitor())
    ready, doc = health.readiness()
    alive, _ = health.liveness()
    text = generate_latest(build_registry(r, process=False)).decode()
    gauges = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line.startswith(("reloadd_watch_armed", "reloadd_watch_degraded"))}
    return {"status": r.status()["watch"], "readyz_watch": doc["watch"], "ready": ready,
            "watch_problem": any(p.startswith("watch") for p in doc["problems"]),
            "alive": alive, "gauges": gauges, "systemd": status_line(r)}


def test_labels_and_serving() -> None:
    assert str(Watch(WatchState.DEGRADED, "inotify watch limit")) == "degraded (rescan-only): inotify watch limit"
    assert str(Watch(WatchState.RESCAN_ONLY, "inotify disabled")) == "rescan-only (inotify disabled)"
    assert [s for s in WatchState if Watch(s).serving] == [WatchState.ARMED, WatchState.DEGRADED,
                                                            WatchState.RESCAN_ONLY]


async def test_armed_then_stopped(tmp_path, recorder_cls) -> None:
    root = tmp_path / "root"
    root.mkdir()
    r = Reloader(config_for(tmp_path), consumers=[recorder_cls([root])])
    async with r:
        await r.wait_idle(10)
        v = views(r)
        assert r.watch == Watch(WatchState.ARMED)
        assert (v["status"], v["readyz_watch"], v["ready"], v["watch_problem"]) == ("armed", "armed", True, False)
        assert v["gauges"] == {"reloadd_watch_armed": 1.0, "reloadd_watch_degraded": 0.0}
        assert "watch armed" in str(v["systemd"])
    v = views(r)
    assert r.watch.state is WatchState.STOPPED
    assert v["alive"] is False and v["status"] == "stopped"


async def test_inotify_off_is_rescan_only_and_ready(tmp_path, recorder_cls) -> None:
    root = tmp_path / "root"
    root.mkdir()
    async with Reloader(config_for(tmp_path, inotify=False, rescan_interval="1s"),
                        consumers=[recorder_cls([root])]) as r:
        await r.wait_idle(10)
        v = views(r)
        assert r.watch == Watch(WatchState.RESCAN_ONLY, "inotify disabled")
        assert v["status"] == v["readyz_watch"] == "rescan-only (inotify disabled)"
        assert v["ready"] is True and v["watch_problem"] is False
        assert v["gauges"] == {"reloadd_watch_armed": 0.0, "reloadd_watch_degraded": 0.0}
