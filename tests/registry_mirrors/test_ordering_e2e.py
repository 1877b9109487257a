"""``after``: a mirror drop-in and a ``.txt`` image list saved together → the pull goes through the new mirror.

Real containerd (CRI pulls honour ``hosts.toml``), two real registries holding the same
image. The list names registry B directly; the drop-in mirrors B to A. Without order the
list is often handled before the mirror exists and the pull goes to B; with
``after = ["mirrors"]`` on the images consumer every pull shows in A's access log.
"""

from __future__ import annotations

import asyncio
import platform
import random
from pathlib import Path

import pytest

from reloadd import Reloader, parse_config
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

pytestmark = pytest.mark.timeout(300)

REPS = 20
RELEASE = "2.x" if "2.x" in releases_under_test() else releases_under_test()[0]


def manifest_gets(reg: Registry) -> int:
    return sum(1 for r in reg.requests() if r.path.startswith("/v2/library/hello/manifests/") and r.status == 200)


async def test_list_and_drop_in_saved_together_pull_through_the_new_mirror(tmp_path: Path) -> None:
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    archive = tmp_path / "hello.tar"
    write_oci_archive(archive, [ImageSpec("example.com/library/hello:v1", platforms=(f"linux/{arch}",), seed="order")])
    hosts_dir = tmp_path / "certs.d"
    conf_d = tmp_path / "registries.conf.d"
    images = tmp_path / "images"
    conf_d.mkdir()
    images.mkdir()
    async with (
        local_registries(tmp_path, 2) as (reg_a, reg_b),
        private_containerd(tmp_path, hosts_dir=hosts_dir, release=RELEASE) as ctd,
    ):
        for reg in (reg_a, reg_b):
            await push_image(archive, f"{reg.host}/library/hello:v1")
        image = f"{reg_b.host}/library/hello:v1"
        cfg = parse_config({
            "reloadd": {"state_dir": str(tmp_path / "state"), "quiet": "100ms", "max_delay": "2s"},
            "consumer": [
                {"name": "mirrors", "plugin": "registry-mirrors", "paths": [str(conf_d)],
                 "options": {"registries_conf": str(tmp_path / "registries.conf"),
                             "registries_conf_d": str(conf_d), "hosts_dir": str(hosts_dir),
                             "certs_dirs": [], "containerd_config": str(ctd.config_path)}},
                {"name": "images", "plugin": "containerd-images", "paths": [str(images)], "after": ["mirrors"],
                 "options": {"address": ctd.address, "namespace": "k8s.io"}},
            ],
        })
        rng = random.Random(2026)
        async with Reloader(cfg) as r:
            await r.wait_idle(30)
            drop, lst = conf_d / "50-mirror.conf", images / "prepull.txt"
            for rep in range(REPS):
                a_before, b_before = manifest_gets(reg_a), manifest_gets(reg_b)
                files = [(drop, mirror_conf(reg_b.host, reg_a.host)), (lst, f"{image}\n")]
                rng.shuffle(files)  # either order, a few milliseconds apart
                for path, text in files:
                    path.write_text(text)
                    await asyncio.sleep(rng.uniform(0, 0.05))
                await r.wait_idle(60)
                assert await ctd.cri_image_status(image) is not None, f"rep {rep}: not pulled"
                got = (manifest_gets(reg_a) - a_before, manifest_gets(reg_b) - b_before)
                assert got[0] >= 1 and got[1] == 0, (
                    f"rep {rep} ({files[0][0].name} first): the pull did not go through the new mirror: {got}"
                )
                drop.unlink()
                lst.unlink()
                hosts_toml, records = hosts_dir / reg_b.host / "hosts.toml", r.engine.slots["images"].records
                for _ in range(600):  # both deletions handled: the mirror is gone, the list forgotten
                    if not hosts_toml.exists() and lst not in records:
                        break
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError(f"rep {rep}: the deletions were not handled within 30 s")
                await r.wait_idle(30)
                await ctd.cri_remove(image)
        assert ctd.panics() == []
