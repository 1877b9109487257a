"""End to end with a real containerd and two real registries: live mirrors, no restart.

A drop-in mirrors a made-up registry host (``.invalid`` never resolves) to registry A;
a CRI PullImage goes to A (its access log shows it). The drop-in then points at B and the
next pull goes to B; broken TOML keeps B and the error is recorded; deleting the drop-in
removes the mirror. containerd is never restarted. Runs on each containerd release (1.6, 1.7,
2.x), each with its own config format (2.x: ``io.containerd.cri.v1.images``), which the
start-up config_path check must read without a complaint.
"""

from __future__ import annotations

import logging
import platform
from pathlib import Path

import pytest

from tests.infra import (
    ImageSpec,
    Registry,
    local_registries,
    private_containerd,
    push_image,
    releases_under_test,
    write_oci_archive,
)

from .conftest import mirror_conf
from .harness import running_reloader

pytestmark = pytest.mark.timeout(240)

UPSTREAM = "registry.reloadd.invalid"
IMAGE = f"{UPSTREAM}/library/hello:v1"


def manifest_gets(reg: Registry) -> int:
    return sum(1 for r in reg.requests() if r.path.startswith("/v2/library/hello/manifests/") and r.status == 200)


@pytest.mark.parametrize("release", releases_under_test())
async def test_live_mirror_switch_without_containerd_restart(
    release: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    archive = tmp_path / "hello.tar"
    write_oci_archive(archive, [ImageSpec(IMAGE, platforms=(f"linux/{arch}",), seed="mirrors")])
    hosts_dir = tmp_path / "certs.d"
    async with (
        local_registries(tmp_path, 2) as (reg_a, reg_b),
        private_containerd(tmp_path, hosts_dir=hosts_dir, release=release) as ctd,
    ):
        for reg in (reg_a, reg_b):
            await push_image(archive, f"{reg.host}/library/hello:v1")
        with caplog.at_level(logging.WARNING, "reloadd.consumer.mirrors"):
            ctx = running_reloader(tmp_path, hosts_dir=str(hosts_dir), containerd_config=str(ctd.config_path))
            async with ctx as run:
                # config_path points at hosts_dir: the start-up check has nothing to say.
                assert [r.getMessage() for r in caplog.records if r.name == "reloadd.consumer.mirrors"] == []
                pid = ctd.proc.pid if ctd.proc else None
                drop = run.conf_d / "50-mirror.conf"

                # 1. Mirror to A: the pull goes to A.
                drop.write_text(mirror_conf(UPSTREAM, reg_a.host))
                await run.wait_path(drop)
                assert run.mirrors(UPSTREAM) == [f"http://{reg_a.host}"]
                await ctd.cri_pull(IMAGE)
                assert manifest_gets(reg_a) >= 1
                assert manifest_gets(reg_b) == 0

                # 2. Switch to B: the next pull goes to B, A sees nothing new.
                await ctd.cri_remove(IMAGE)
                a_before = len(reg_a.requests())
                drop.write_text(mirror_conf(UPSTREAM, reg_b.host))
                await run.wait_path(drop, 2)
                assert run.mirrors(UPSTREAM) == [f"http://{reg_b.host}"]
                await ctd.cri_pull(IMAGE)
                assert manifest_gets(reg_b) >= 1
                assert len(reg_a.requests()) == a_before

                # 3. Break the TOML: the error is recorded, pulls keep using B.
                drop.write_text(mirror_conf(UPSTREAM, reg_a.host).replace("[[registry]]", "[[registry]"))
                await run.wait_path(drop, 3)
                await run.reloader.wait_idle(15)
                record = run.reloader.engine.slots["mirrors"].records[drop]
                assert record.error is not None and record.error.startswith(f"{drop}: invalid TOML")
                assert run.consumer.stats["config_valid"] == 0
                await ctd.cri_remove(IMAGE)
                b_before = manifest_gets(reg_b)
                await ctd.cri_pull(IMAGE)
                assert manifest_gets(reg_b) > b_before
                assert len(reg_a.requests()) == a_before

                # 4. Delete the drop-in: the mirror disappears, nothing is asked of A or B.
                drop.unlink()
                await run.wait_path(drop, 4)
                assert run.mirrors(UPSTREAM) is None
                assert list(hosts_dir.iterdir()) == []
                await ctd.cri_remove(IMAGE)
                seen = (len(reg_a.requests()), len(reg_b.requests()))
                with pytest.raises(Exception, match=UPSTREAM):
                    await ctd.cri_pull(IMAGE, timeout=60)
                assert (len(reg_a.requests()), len(reg_b.requests())) == seen

                assert ctd.proc is not None and ctd.proc.pid == pid  # never restarted
        assert ctd.panics() == []
