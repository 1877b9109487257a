"""reloadd's own OCI image: built offline and reproducibly for amd64 and arm64, imported by reloadd, and it runs.

``scripts/image/build_image.py`` (what ``make image`` runs) bootstraps Debian with mmdebstrap from the
machine's own sources for each architecture (arm64's maintainer scripts under qemu-user-static) and installs
the project's wheels (PyPI's aarch64 wheels for arm64's dependencies): no container registry anywhere. One
OCI image index holds both; reloadd's containerd-images consumer imports it and containerd unpacks this
machine's platform.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import platform as platform_module
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from reloadd import Ack
from tests.containerd_images._helpers import Harness
from tests.infra import private_containerd

pytestmark = pytest.mark.timeout(3600)  # four root file systems, two of them arm64 under emulation (~8 min a build)

ROOT = Path(__file__).resolve().parents[2]
NAME = "localhost/reloadd:0.1.0"


def build(out: Path, work: Path, epoch: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/image/build_image.py"), str(out), "--work", str(work),
                           "--epoch", epoch], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return hashlib.sha256(out.read_bytes()).hexdigest()


def platforms(archive: Path) -> dict[str, str]:
    """``os/arch[/variant]`` → manifest digest, from the image index that ``index.json`` names."""
    with tarfile.open(archive) as outer:
        index = json.loads(blob_of(outer, "index.json"))
        (entry,) = index["manifests"]
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == NAME
        assert entry["mediaType"] == "application/vnd.oci.image.index.v1+json"
        image_index = json.loads(blob_of(outer, f"blobs/sha256/{entry['digest'].split(':', 1)[1]}"))
    return {"/".join(filter(None, (m["platform"]["os"], m["platform"]["architecture"],
                                   m["platform"].get("variant")))): m["digest"] for m in image_index["manifests"]}


def config_digest(archive: Path, platform: str) -> str:
    """The config digest of ``platform``'s manifest (what CRI reports as the image id)."""
    with tarfile.open(archive) as outer:
        manifest = json.loads(blob_of(outer, f"blobs/sha256/{platforms(archive)[platform].split(':', 1)[1]}"))
    return str(manifest["config"]["digest"])


def unpack(archive: Path, into: Path, platform: str) -> dict[str, object]:
    """``platform``'s root file system (its one layer) under ``into``; returns its config."""
    digest = platforms(archive)[platform]
    with tarfile.open(archive) as outer:
        def blob(digest: str) -> bytes:
            f = outer.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
            assert f is not None
            return f.read()

        manifest = json.loads(blob(digest))
        config = json.loads(blob(manifest["config"]["digest"]))
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO(blob(layer["digest"])), mode="r:gz") as inner:
                inner.extractall(into, filter="fully_trusted")
    return config


def blob_of(tar: tarfile.TarFile, name: str) -> bytes:
    f = tar.extractfile(name)
    assert f is not None
    return f.read()


async def test_the_image_is_reproducible_imports_and_runs(tmp_path: Path) -> None:
    # The default epoch is the last commit's time, read once here: a commit made while the ~8-minute builds run
    # must not make them differ.
    epoch = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%ct"], capture_output=True, text=True,
                           check=True).stdout.strip()
    first = await asyncio.to_thread(build, tmp_path / "a.tar", tmp_path / "work-a", epoch)
    second = await asyncio.to_thread(build, tmp_path / "b.tar", tmp_path / "work-b", epoch)
    assert first == second, "two builds of the same inputs differ"

    assert sorted(platforms(tmp_path / "a.tar")) == ["linux/amd64", "linux/arm64/v8"]

    configs: dict[str, str] = {}
    # Each platform's root file system runs: arm64's through qemu-user-static (binfmt_misc), as on a board.
    for platform in ("linux/amd64", "linux/arm64/v8"):
        rootfs = tmp_path / f"rootfs-{platform.split('/')[1]}"
        config = await asyncio.to_thread(unpack, tmp_path / "a.tar", rootfs, platform)
        assert config["architecture"] == platform.split("/")[1]
        configs[platform] = config_digest(tmp_path / "a.tar", platform)
        env = {e.split("=", 1)[0]: e.split("=", 1)[1] for e in config["config"]["Env"]}  # type: ignore[index]
        entry = config["config"]["Entrypoint"]  # type: ignore[index]
        for args, expected in ((["--version"], "reloadd 0.1.0"),
                               (["check", "--config", "/etc/reloadd/reloadd.toml"], "OK (2 consumer(s))"),  # node agent
                               (["check", "--config", "/etc/reloadd/applier.toml"], "OK (1 consumer(s))")):
            proc = await asyncio.to_thread(subprocess.run, ["/usr/sbin/chroot", str(rootfs), *entry, *args],
                                           env=env, capture_output=True, text=True, timeout=180)
            assert proc.returncode == 0 and expected in proc.stdout + proc.stderr, (platform, args, proc.stdout,
                                                                                    proc.stderr)
        machine = await asyncio.to_thread(subprocess.run, ["/usr/sbin/chroot", str(rootfs), "/usr/bin/uname", "-m"],
                                          capture_output=True, text=True, timeout=60)
        assert machine.stdout.strip() == {"amd64": "x86_64", "arm64": "aarch64"}[config["architecture"]]  # type: ignore[index]

    host = {"x86_64": "linux/amd64", "aarch64": "linux/arm64/v8"}[platform_module.machine()]
    host_config = configs[host]
    async with private_containerd(tmp_path) as ctd:
        images = tmp_path / "images"
        images.mkdir()
        os.link(tmp_path / "a.tar", images / "reloadd.tar")
        (tmp_path / "state").mkdir()
        h = Harness(ctd, images, tmp_path / "state", {})
        try:
            res = await h.handle(images / "reloadd.tar")
            assert isinstance(res[images / "reloadd.tar"], Ack), res
            img = await h.consumer.client.get_image(NAME)
            assert img is not None and img.labels.get("io.cri-containerd.pinned") == "pinned"
            assert img.target.media_type == "application/vnd.oci.image.index.v1+json"  # the index, both platforms
            # The kubelet's view (CRI): the image is this machine's platform, its config digest the image id.
            status = await ctd.cri_image_status(NAME)
            assert status is not None and status.id == host_config, (status, host_config)
        finally:
            await h.consumer.close()
