"""Build reloadd's OCI image archive offline: Debian packages plus the project's wheels, no base image.

    python scripts/image/build_image.py OUT.tar [--work DIR] [--epoch SECONDS]

1. ``mmdebstrap`` (minbase + python3, python3-venv, ca-certificates) from the machine's own Debian sources
   (``/etc/apt/sources.list.d/*.sources`` or ``/etc/apt/sources.list``): no container registry is asked.
   ``/etc/reloadd/reloadd.toml`` is the node agent's own config and ``/etc/reloadd/applier.toml`` the applier's
   (``examples/kubernetes/{node-agent,applier}/configmap.yaml``): one image, two roles.
2. ``pip wheel`` of reloadd and its four plugins (and their dependencies), installed with ``--no-index`` into
   a venv at ``/opt/reloadd`` inside the root file system, in a chroot with a clean environment.
3. One layer, written reproducibly: entries sorted, every mtime ``SOURCE_DATE_EPOCH``, numeric owners only,
   gzip without a timestamp; an OCI image layout (``oci-layout``, ``index.json`` naming
   ``localhost/reloadd:<version>``, config, manifest) in a tar written the same way. Same inputs (packages,
   wheels, epoch), same digest.

The epoch defaults to the last commit's time, so two builds of one commit agree.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ("containerd-images", "exec", "kube-manifests", "registry-mirrors")
DISTS = ("reloadd", *(f"reloadd-{p}" for p in PLUGINS))
PACKAGES = ("python3", "python3-venv", "ca-certificates")
CHROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
              "HOME": "/root"}


def run(argv: list[str], env: dict[str, str] | None = None) -> None:
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, check=True, env=env, stdin=subprocess.DEVNULL)


def sources() -> tuple[str, str]:
    """The machine's Debian sources file and its first suite (the release the image is built from)."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for line in path.read_text().splitlines():
            if line.startswith("Suites:"):
                return str(path), line.split()[1]
    listing = Path("/etc/apt/sources.list")
    for line in listing.read_text().splitlines() if listing.exists() else ():
        parts = line.split()
        if parts and parts[0] == "deb":
            return str(listing), parts[2 if not parts[1].startswith("[") else 3]
    raise SystemExit("no Debian source line found in /etc/apt: cannot bootstrap")


def version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    for line in text.splitlines():
        if line.startswith("version"):
            return line.split("=", 1)[1].strip().strip('"')
    raise SystemExit("no version in pyproject.toml")


def epoch() -> int:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%ct"], check=True,
                             capture_output=True, text=True).stdout.strip()
        return int(out)
    except (OSError, subprocess.CalledProcessError, ValueError):
        return 0


def rootfs(work: Path, when: int) -> Path:
    target = work / "rootfs"
    if target.exists():
        shutil.rmtree(target)
    src, suite = sources()
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(when)}
    run(["mmdebstrap", "--mode=root", "--variant=minbase", f"--include={','.join(PACKAGES)}", "--quiet",
         suite, str(target), src], env=env)
    wheels = work / "wheels"
    if wheels.exists():
        shutil.rmtree(wheels)
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels), str(ROOT),
         *(str(ROOT / "plugins" / p) for p in PLUGINS)], env={**os.environ, "SOURCE_DATE_EPOCH": str(when)})
    shutil.copytree(wheels, target / "tmp" / "wheels")
    chroot_env = {**CHROOT_ENV, "SOURCE_DATE_EPOCH": str(when), "PYTHONHASHSEED": "0"}
    run(["chroot", str(target), "python3", "-m", "venv", "/opt/reloadd"], env=chroot_env)
    run(["chroot", str(target), "/opt/reloadd/bin/pip", "install", "--quiet", "--no-index", "--no-cache-dir",
         "--no-compile", "--find-links", "/tmp/wheels", *DISTS], env=chroot_env)
    shutil.rmtree(target / "tmp" / "wheels")
    (target / "usr" / "local" / "bin" / "reloadd").symlink_to("/opt/reloadd/bin/reloadd")
    etc = target / "etc" / "reloadd"
    etc.mkdir(parents=True, exist_ok=True)
    # Each role's own configuration (its ConfigMap), so `reloadd check` in the image checks what ships.
    import yaml

    for role, file in (("node-agent", "reloadd.toml"), ("applier", "applier.toml")):
        shipped = yaml.safe_load((ROOT / "examples" / "kubernetes" / role / "configmap.yaml").read_text())
        (etc / file).write_text(shipped["data"]["reloadd.toml"])
    for junk in ("var/cache/apt", "var/lib/apt/lists", "var/log", "root/.cache"):
        path = target / junk
        if path.is_dir():
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    return target


def layer_tar(root: Path, when: int) -> bytes:
    """The root file system as one reproducible tar (sorted, clamped mtimes, numeric owners)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted([*dirnames, *filenames]):
                path = Path(dirpath) / name
                info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
                info.mtime = min(int(info.mtime), when)
                info.uname = info.gname = ""
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def oci_archive(layer: bytes, when: int, name: str) -> bytes:
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, compresslevel=6) as z:
        z.write(layer)
    compressed = gz.getvalue()
    created = datetime.datetime.fromtimestamp(when, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = _json({
        "architecture": "amd64", "os": "linux", "created": created,
        "config": {"Entrypoint": ["/opt/reloadd/bin/reloadd"],
                   "Cmd": ["run", "--config", "/etc/reloadd/reloadd.toml"],
                   "Env": ["PATH=/opt/reloadd/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                           "LANG=C.UTF-8"],
                   "Labels": {"org.opencontainers.image.title": "reloadd",
                              "org.opencontainers.image.version": name.rsplit(":", 1)[1]}},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
        "history": [{"created": created, "created_by": "scripts/image/build_image.py (mmdebstrap + wheels)"}],
    })
    manifest = _json({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _digest(config),
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": _digest(compressed),
                    "size": len(compressed)}],
    })
    index = _json({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _digest(manifest),
                       "size": len(manifest), "platform": {"architecture": "amd64", "os": "linux"},
                       "annotations": {"org.opencontainers.image.ref.name": name,
                                       "io.containerd.image.name": name}}],
    })
    entries = {"oci-layout": _json({"imageLayoutVersion": "1.0.0"}), "index.json": index}
    for blob in (config, manifest, compressed):
        entries[f"blobs/sha256/{_digest(blob).split(':', 1)[1]}"] = blob
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, when
            tar.addfile(info)
        for arc, data in sorted(entries.items()):
            info = tarfile.TarInfo(arc)
            info.size, info.mode, info.mtime = len(data), 0o644, when
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "image")
    ap.add_argument("--epoch", type=int, default=None)
    args = ap.parse_args()
    when = epoch() if args.epoch is None else args.epoch
    args.work.mkdir(parents=True, exist_ok=True)
    root = rootfs(args.work, when)
    name = f"localhost/reloadd:{version()}"
    archive = oci_archive(layer_tar(root, when), when, name)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(archive)
    index = json.loads(tarfile.open(args.out).extractfile("index.json").read())  # type: ignore[union-attr]
    print(f"wrote {args.out} ({len(archive) >> 20} MiB): {name} {index['manifests'][0]['digest']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
