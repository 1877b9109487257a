"""Runnable images for the test node, made offline from Debian's ``busybox-static``.

The generated images of :mod:`tests.infra.images` hold random bytes: containerd imports them, but a
kubelet cannot run them. A node in the test bed needs images whose command really runs: a sandbox
("pause") image, a service that keeps running, one whose entrypoint exits. No registry is reachable, so
they are built here from the one static binary ``busybox-static`` installs (``/bin/busybox``, no shared
libraries needed) into a one-layer OCI image, and written with :func:`tests.infra.write_oci_archive`.

Example::

    write_oci_archive(tmp_path / "web.tar", [busybox_image("docker.io/demo/web:v1", SERVE)])
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path

from .images import BuiltImage, Descriptor, ImageSpec, PlatformImage

__all__ = ["BUSYBOX", "CRASH", "PAUSE", "SERVE", "busybox_image"]

BUSYBOX = Path("/bin/busybox")
"""Debian's ``busybox-static`` (``scripts/infra/install-deps.sh`` installs it)."""

PAUSE = ("/bin/busybox", "sleep", "2147483647")
"""A sandbox's command: sleeps until the runtime kills it (CRI stops a sandbox with SIGKILL)."""

SERVE = ("/bin/busybox", "sh", "-c", "trap 'exit 0' TERM; /bin/busybox sleep 2147483647 & wait")
"""A long-running container that exits at once on SIGTERM (PID 1 has no default handler: a bare sleep
would hold every pod deletion for its whole grace period)."""

CRASH = ("/bin/busybox", "sh", "-c", "echo starting; exit 3")
"""An entrypoint that exits non-zero at once: its pod crash-loops."""

_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _layer(binary: bytes) -> bytes:
    """A tar of ``bin/busybox`` (mode 0755) and ``bin/sh`` linked to it, with fixed headers."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name in ("bin/", "tmp/"):
            d = tarfile.TarInfo(name.rstrip("/"))
            d.type, d.mode, d.mtime = tarfile.DIRTYPE, 0o755 if name == "bin/" else 0o1777, 0
            tf.addfile(d)
        f = tarfile.TarInfo("bin/busybox")
        f.size, f.mode, f.mtime = len(binary), 0o755, 0
        tf.addfile(f, io.BytesIO(binary))
        link = tarfile.TarInfo("bin/sh")
        link.type, link.linkname, link.mode, link.mtime = tarfile.SYMTYPE, "busybox", 0o777, 0
        tf.addfile(link)
    return buf.getvalue()


@functools.lru_cache(maxsize=4)
def _layer_blob(busybox: Path) -> tuple[bytes, bytes]:
    """The layer (uncompressed, gzipped) of ``busybox``: built once per session, it is 2 MB."""
    raw = _layer(busybox.read_bytes())
    return raw, gzip.compress(raw, compresslevel=1, mtime=0)


def busybox_image(name: str, command: Sequence[str] = SERVE, *, busybox: Path = BUSYBOX) -> BuiltImage:
    """A one-layer linux/amd64 image named ``name`` whose entrypoint is ``command``.

    Images with the same binary share their layer (containerd stores and unpacks it once); the command
    lives in the config, so two names with different commands are two images.

    Raises:
        FileNotFoundError: ``busybox-static`` is not installed (run ``make deps``).
    """
    raw, blob = _layer_blob(busybox)
    layer = Descriptor("application/vnd.oci.image.layer.v1.tar+gzip", _sha(blob), len(blob))
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": list(command), "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [_sha(raw)]},
        "history": [{"created_by": "reloadd test bed: busybox-static"}],
    }, separators=(",", ":")).encode()
    cdesc = Descriptor("application/vnd.oci.image.config.v1+json", _sha(config), len(config))
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": _MANIFEST, "config": cdesc.to_json(), "layers": [layer.to_json()],
    }, separators=(",", ":")).encode()
    mdesc = Descriptor(_MANIFEST, _sha(manifest), len(manifest))
    plat = PlatformImage("linux/amd64", mdesc, cdesc, [layer], [_sha(raw)])
    blobs = {layer.digest: blob, cdesc.digest: config, mdesc.digest: manifest}
    return BuiltImage(ImageSpec(name, seed="busybox"), mdesc, [plat], blobs)
