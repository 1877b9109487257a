"""containerd-images under crashes: SIGKILL of `reloadd run`, then of containerd, in the middle of an import.

Both start a real private containerd (tests/infra), drop a ~100 MB uncompressed tarball into
the watched folder and kill one side while containerd holds an unfinished ingest of it.
Afterwards the image must be complete (``ctr images check``), and containerd must hold no
lease and no unfinished ingest: nothing leaks past the crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from reloadd_containerd_images._client import ContainerdClient

from tests.faults._daemon import Daemon
from tests.infra import Containerd, ImageSpec, private_containerd, write_oci_archive
from tests.waiting import until

pytestmark = pytest.mark.timeout(240)

IMAGE = "example.com/faults/big:v1"


def big_archive(path: Path) -> str:
    built = write_oci_archive(
        path, [ImageSpec(IMAGE, seed="faults", layers=4, layer_size=24 << 20, layer_compression="none")]
    )
    return str(built[0].target.digest)


@contextlib.asynccontextmanager
async def world(tmp_path: Path) -> AsyncIterator[tuple[Containerd, Daemon, ContainerdClient, Path]]:
    images = tmp_path / "images"
    images.mkdir()
    async with private_containerd(tmp_path) as ctd:
        sock = tmp_path / "ctl.sock"
        cfg = tmp_path / "reloadd.toml"
        cfg.write_text(textwrap.dedent(f"""
            [reloadd]
            state_dir = "{tmp_path / 'state'}"
            control_socket = "{sock}"
            quiet = "100ms"
            [[consumer]]
            name = "images"
            plugin = "containerd-images"
            paths = ["{images}"]
            [consumer.options]
            address = "{ctd.address}"
        """))
        probe = ContainerdClient(ctd.address, "k8s.io")
        try:
            async with Daemon(cfg, tmp_path / "daemon.log", control_socket=sock) as daemon:
                await until(daemon.idle, what="reloadd started")
                yield ctd, daemon, probe, images
        finally:
            probe.close()


async def wait_ingest(probe: ContainerdClient, timeout: float = 60.0) -> None:
    """Until containerd has an unfinished ingest (it publishes no event for that: polled)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        with contextlib.suppress(Exception):  # containerd busy or restarting
            if await probe.list_ingests():
                return
        await asyncio.sleep(0.005)
    raise TimeoutError("no ingest seen")


async def leftovers(ctd: Containerd) -> tuple[list[str], list[str]]:
    leases = (await ctd.ctr("leases", "ls", "-q")).split()
    active = (await ctd.ctr("content", "active")).strip().splitlines()[1:]
    return leases, active


async def complete(ctd: Containerd, digest: str) -> bool:
    out = await ctd.ctr("images", "check", check=False)
    return any(IMAGE in line and "complete" in line and digest in line for line in out.splitlines())


def imports_logged(log: Path) -> int:
    """Completed imports of big.tar, from the consumer's one summary line per file."""
    return sum(1 for line in log.read_text().splitlines() if "big.tar: 1 image(s)" in line and "Imported " in line)


async def test_reloadd_killed_mid_import(tmp_path: Path, reliability) -> None:
    async with world(tmp_path) as (ctd, daemon, probe, images):
        digest = big_archive(tmp_path / "big.tar")
        (tmp_path / "big.tar").rename(images / "big.tar")
        await wait_ingest(probe)
        await daemon.kill9()
        leases_at_crash, active_at_crash = await leftovers(ctd)
        assert leases_at_crash  # the crash left its lease behind (with an expiry) ...
        await daemon.start()
        await until(daemon.idle, timeout=120, what="import redone after the restart")
        assert await complete(ctd, digest)
        assert await leftovers(ctd) == ([], [])  # ... which the restarted consumer removed at once
        imports = imports_logged(tmp_path / "daemon.log")
        assert imports == 1
    reliability.record("containerd-images: SIGKILL reloadd mid-import, restart", trials=1, expected=1,
                       delivered=imports,
                       notes=f"at the crash: {len(leases_at_crash)} lease(s), {len(active_at_crash)} unfinished "
                             "ingest(s); after the restart: image complete, 0 leases, 0 ingests")


async def test_containerd_killed_mid_import(tmp_path: Path, reliability) -> None:
    async with world(tmp_path) as (ctd, daemon, probe, images):
        digest = big_archive(tmp_path / "big.tar")
        (tmp_path / "big.tar").rename(images / "big.tar")
        await wait_ingest(probe)
        await ctd.kill()

        def failing() -> bool:
            doc = daemon.status() or {}
            return bool(doc.get("consumers", {}).get("images", {}).get("failing"))

        await until(failing, what="the import to fail and be scheduled for a retry")
        await ctd.start()
        await until(daemon.idle, timeout=120, what="import retried after containerd came back")
        assert await complete(ctd, digest)
        assert await leftovers(ctd) == ([], [])
        imports = imports_logged(tmp_path / "daemon.log")
        assert imports == 1
    reliability.record("containerd-images: SIGKILL containerd mid-import, restart it", trials=1, expected=1,
                       delivered=imports,
                       notes="retried by the engine; image complete, 0 leases, 0 unfinished ingests")
