"""Generate big OCI image tarballs on disk, streaming (no layer held in memory)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import random
import tarfile
import tempfile
from pathlib import Path

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _sha_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 20):
            h.update(b)
    return "sha256:" + h.hexdigest(), path.stat().st_size


def big_oci_tarball(
    out: Path, name: str, layers: int, mb_per_layer: int, seed: str = "bench", compress: bool = True
) -> Path:
    """An OCI archive with ``layers`` layers of ``mb_per_layer`` MB of files (7/8 random, 1/8 text).

    The text part gives gzip something to compress, as in real images; the tarball stays
    close to the uncompressed size.
    """
    rng = random.Random(seed)
    tmp = Path(tempfile.mkdtemp(dir=out.parent))
    layer_files: list[tuple[Path, str, int, str]] = []
    try:
        for li in range(layers):
            raw = tmp / f"layer{li}.tar"
            with tarfile.open(raw, "w", format=tarfile.PAX_FORMAT) as tf:
                for fi in range(mb_per_layer):
                    data = rng.randbytes(7 << 17) + (f"line {li} {fi} " * 10000)[: 1 << 17].encode()
                    ti = tarfile.TarInfo(f"l{li}/f{fi}.bin")
                    ti.size, ti.mode, ti.mtime = len(data), 0o644, 0
                    tf.addfile(ti, io.BytesIO(data))
            diff_id, _ = _sha_file(raw)
            if compress:
                gz = tmp / f"layer{li}.tar.gz"
                with open(raw, "rb") as src, gzip.GzipFile(gz, "wb", compresslevel=1, mtime=0) as dst:
                    while b := src.read(1 << 20):
                        dst.write(b)
                raw.unlink()
                blob = gz
            else:
                blob = raw
            digest, size = _sha_file(blob)
            layer_files.append((blob, digest, size, diff_id))
        config = json.dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {},
                "rootfs": {"type": "layers", "diff_ids": [x[3] for x in layer_files]},
            }
        ).encode()
        cdig = "sha256:" + hashlib.sha256(config).hexdigest()
        mt = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if compress else "")
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": cdig,
                    "size": len(config),
                },
                "layers": [{"mediaType": mt, "digest": d, "size": s} for _, d, s, _ in layer_files],
            }
        ).encode()
        mdig = "sha256:" + hashlib.sha256(manifest).hexdigest()
        index = json.dumps(
            {
                "schemaVersion": 2,
                "manifests": [
                    {
                        "mediaType": OCI_MANIFEST,
                        "digest": mdig,
                        "size": len(manifest),
                        "annotations": {"io.containerd.image.name": name},
                    }
                ],
            }
        ).encode()
        with tarfile.open(out, "w") as tf:

            def add(n: str, b: bytes) -> None:
                ti = tarfile.TarInfo(n)
                ti.size = len(b)
                tf.addfile(ti, io.BytesIO(b))

            add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
            add("index.json", index)
            add("blobs/sha256/" + cdig[7:], config)
            add("blobs/sha256/" + mdig[7:], manifest)
            for blob, d, _, _ in layer_files:
                tf.add(blob, "blobs/sha256/" + d[7:])
    finally:
        for p in tmp.iterdir():
            p.unlink()
        os.rmdir(tmp)
    return out
