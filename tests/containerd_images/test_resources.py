"""Memory stays bounded whatever the tarball size, and the event loop keeps running during an import."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from tests.infra import Containerd, ImageSpec, compress, write_oci_archive

pytestmark = pytest.mark.timeout(240)


async def test_big_gzip_tarball_bounded_memory_and_responsive_loop(ctd: Containerd, tmp_path: Path) -> None:
    plain = tmp_path / "big.tar"
    # 3 layers x 48 MB of random data: a ~145 MB tarball, gzip-compressed as a whole.
    write_oci_archive(
        plain, [ImageSpec("example.com/big:v1", seed="mem", layers=3, layer_size=48 << 20, layer_compression="none")]
    )
    images = tmp_path / "images"
    images.mkdir()
    packed = compress(plain, "gz", dest=images / "big.tar.gz")
    plain.unlink()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).with_name("_import_child.py")),
        ctd.address,
        str(packed),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-3000:]
    report = json.loads(out.decode().strip().splitlines()[-1])
    assert report["ok"], report
    assert report["max_rss_mb"] < 100, report  # the file is ~145 MB; 1 MiB chunks, 8 + 4 in flight
    assert report["max_lag"] < 0.5, report  # decompression and reads run in a worker thread
    assert await ctd.cri_image_status("example.com/big:v1") is not None
