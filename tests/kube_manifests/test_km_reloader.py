"""End to end: the real engine (inotify, settle, SIGHUP) driving the plugin against a real kube-apiserver."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from reloadd_kube_manifests import LABEL_PART_OF

import reloadd
from tests.waiting import until

from .support import KubeCluster, cm

pytestmark = pytest.mark.timeout(120)


def write_atomic(path: Path, objs: list[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n---\n".join(json.dumps(o) for o in objs))
    tmp.rename(path)


async def test_files_applied_pruned_and_drift_restored_on_sighup(kube: KubeCluster, tmp_path: Path,
                                                                 namespace: str) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    write_atomic(manifests / "a.yaml", [cm("e2e-a", namespace, v="1"), cm("e2e-b", namespace, v="1")])
    cfg = reloadd.parse_config({
        "reloadd": {"state_dir": str(tmp_path / "state"), "quiet": "50ms"},
        "consumer": [{
            "name": "manifests", "plugin": "kube-manifests", "paths": [str(manifests)],
            "options": {"kubeconfig": str(kube.kubeconfig)},
        }],
    })
    path_a = f"/api/v1/namespaces/{namespace}/configmaps/e2e-a"
    path_b = f"/api/v1/namespaces/{namespace}/configmaps/e2e-b"
    async with reloadd.Reloader(cfg, install_signal_handlers=True) as r:
        await r.wait_idle(60)
        assert kube.get(path_a)["data"] == {"v": "1"}

        write_atomic(manifests / "a.yaml", [cm("e2e-a", namespace, v="2")])
        await until(lambda: kube.get(path_b) is None, what="e2e-b pruned")
        assert kube.get(path_a)["data"] == {"v": "2"}

        obj = kube.get(path_a)
        obj["data"]["v"] = "drifted"
        assert kube.request("PUT", path_a, obj)[0] == 200
        os.kill(os.getpid(), signal.SIGHUP)
        await until(lambda: kube.get(path_a)["data"] == {"v": "2"}, what="drift restored after SIGHUP")

        uid = kube.get(path_a)["metadata"]["uid"]
        old_set = kube.get(path_a)["metadata"]["labels"][LABEL_PART_OF]
        (manifests / "a.yaml").rename(manifests / "renamed.yaml")
        await until(lambda: kube.get(path_a)["metadata"]["labels"][LABEL_PART_OF] != old_set,
                    what="e2e-a moved to the renamed file's set")
        await r.wait_idle(30)
        assert kube.get(path_a)["metadata"]["uid"] == uid, "the rename deleted and re-created the object"

        (manifests / "renamed.yaml").unlink()
        await until(lambda: kube.get(path_a) is None, what="e2e-a deleted with its file")
        await r.wait_idle(30)


async def test_an_expected_failure_is_one_warning_line(
    kube: KubeCluster, tmp_path: Path, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A file the server refuses is one WARNING line naming the file, its cause and how it is retried."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    bad = manifests / "bad.yaml"
    bad_cm = cm("e2e-bad", namespace)
    bad_cm["data"] = {"not a valid key!": "x"}  # the server refuses it: a Reject, not a retry
    write_atomic(bad, [bad_cm])
    cfg = reloadd.parse_config({
        "reloadd": {"state_dir": str(tmp_path / "state"), "quiet": "50ms"},
        "consumer": [{
            "name": "manifests", "plugin": "kube-manifests", "paths": [str(manifests)],
            "options": {"kubeconfig": str(kube.kubeconfig)},
        }],
    })
    caplog.set_level(logging.DEBUG, logger="reloadd")
    async with reloadd.Reloader(cfg) as r:
        await r.wait_idle(60)
        assert r.status()["consumers"]["manifests"]["rejected"], "the bad file was not refused"
    lines = [rec for rec in caplog.records if rec.levelno >= logging.WARNING and str(bad) in rec.getMessage()]
    assert len(lines) == 1, [rec.getMessage() for rec in lines]
    text = lines[0].getMessage()
    assert "e2e-bad" in text and "SIGHUP" in text, text
    assert lines[0].exc_info is None
