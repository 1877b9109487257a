"""``HealthReporting``: what a consumer says of the health of what it delivered reaches status, ``--json``,
``/metrics``, and holds back the consumers ordered ``after`` it while it is settling."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from reloadd import FileHealth, HealthReport, HealthReporting, Histogram, Reloader
from reloadd._ops._metrics import ReloaderCollector, build_registry, render
from reloadd._ops._terminal import format_status
from tests.waiting import until

from ..conftest import Recorder, config_for

pytestmark = pytest.mark.timeout(60)


class Healthy(Recorder):
    """A recorder whose delivered paths are settling until the test says they are done."""

    def __init__(self, roots: list[Path], **attrs: Any) -> None:
        super().__init__(roots, **attrs)
        self.report = HealthReport()

    def health(self) -> HealthReport:
        return self.report

    def settle(self, report: HealthReport) -> None:
        self.report = report
        self.ctx.health_changed()


async def test_health_in_status_json_and_metrics(tmp_path: Path) -> None:
    root = tmp_path / "in"
    root.mkdir()
    c = Healthy([root], name="manifests")
    assert isinstance(c, HealthReporting)
    since = time.time() - 75
    c.report = HealthReport(
        {"current": 3, "failed": 1},
        (FileHealth(str(root / "web.yaml"), "failed", since, "Deployment web/app", "ProgressDeadlineExceeded",
                    'ReplicaSet "app-5d" has timed out progressing.'),),
        False, Histogram((1.0, 5.0), (1, 2), 4.5, 3))
    async with Reloader(config_for(tmp_path), consumers=[c]) as r:
        await r.wait_idle(10)
        doc = r.status()["consumers"]["manifests"]["health"]
        assert doc["objects"] == {"current": 3, "failed": 1} and doc["settling"] is False
        (f,) = doc["files"]
        assert f["state"] == "failed" and f["reason"] == "ProgressDeadlineExceeded" and 74 <= f["for"] < 90
        text = format_status(r.status())
        assert "health:    3 current, 1 failed" in text, text
        assert (f"FAILED     {root / 'web.yaml'} for 75s: Deployment web/app: ProgressDeadlineExceeded: "
                f'ReplicaSet "app-5d" has timed out progressing.') in text, text
        metrics = render(ReloaderCollector(r).collect()).decode()
        from prometheus_client import generate_latest

        exported = generate_latest(build_registry(r, process=False)).decode()
    assert 'reloadd_objects{consumer="manifests",health="failed"} 1.0' in metrics
    assert "# TYPE reloadd_health_current_seconds histogram" in metrics
    assert 'reloadd_health_current_seconds_bucket{consumer="manifests",le="5.0"} 2.0' in metrics
    assert 'reloadd_health_current_seconds_bucket{consumer="manifests",le="+Inf"} 3.0' in metrics
    assert 'reloadd_health_current_seconds_sum{consumer="manifests"} 4.5' in metrics
    assert 'reloadd_health_current_seconds_count{consumer="manifests"} 3.0' in metrics
    # The same families through an embedder's prometheus_client registry.
    assert 'reloadd_health_current_seconds_bucket{consumer="manifests",le="5.0"} 2.0' in exported, exported
    assert 'reloadd_health_current_seconds_sum{consumer="manifests"} 4.5' in exported, exported
    assert 'reloadd_objects{consumer="manifests",health="failed"} 1.0' in exported, exported


async def test_after_waits_while_health_settles(tmp_path: Path) -> None:
    a_root, b_root = tmp_path / "a", tmp_path / "b"
    a_root.mkdir()
    b_root.mkdir()
    first = Healthy([a_root], name="manifests")
    second = Recorder([b_root], name="later", after=("manifests",))
    first.report = HealthReport(settling=True)
    async with Reloader(config_for(tmp_path), consumers=[first, second]) as r:
        (b_root / "x").write_text("x")
        status: dict[str, Any] = {}

        def waiting() -> bool:
            status.update(r.status()["consumers"]["later"])
            return status.get("waiting_for") == ["manifests"]

        await until(waiting, what="`later` waiting for the health of `manifests`", timeout=10)
        assert second.batches == []
        first.settle(HealthReport(settling=False))
        await until(lambda: len(second.batches) == 1, what="`later` handed its path", timeout=10)
