"""Build reloadd's OCI image archive offline: Debian packages plus the project's wheels, no base image.

    python scripts/image/build_image.py OUT.tar [--work DIR] [--epoch SECONDS] [--platforms amd64,arm64]

One root file system per architecture (default amd64 and arm64: edge and air-gapped clusters run on arm64
boards), each its own image manifest, both under one OCI image index named ``localhost/reloadd:<version>``:
containerd (and reloadd's importer) unpacks the node's own platform.

1. ``mmdebstrap`` (minbase + python3, python3-venv, ca-certificates) from the machine's own Debian sources
   (``/etc/apt/sources.list.d/*.sources`` or ``/etc/apt/sources.list``): no container registry is asked.
   A foreign architecture's packages are Debian's own for it; their maintainer scripts run under
   ``qemu-user-static`` through binfmt_misc (``scripts/image/install-deps.sh`` sets both up).
   ``/etc/reloadd/reloadd.toml`` is the node agent's own config and ``/etc/reloadd/applier.toml`` the applier's
   (``examples/kubernetes/{node-agent,applier}/configmap.yaml``): one image, two roles.
2. ``pip wheel`` of reloadd and its four plugins (pure Python, the same wheels for every architecture) and
   their dependencies: built for this machine's architecture, and PyPI's binary wheels for CPython 3.11 on
   manylinux for another (``pip download --only-binary=:all: --platform ...``). Installed with ``--no-index``
   into a venv at ``/opt/reloadd`` inside the root file system, in a chroot with a clean environment.
3. One layer per architecture, written reproducibly: entries sorted, every mtime ``SOURCE_DATE_EPOCH``,
   numeric owners only, gzip without a timestamp; an OCI image layout (``oci-layout``, ``index.json`` naming
   ``localhost/reloadd:<version>`` and pointing at the image index, which lists one manifest per platform) in a
   tar written the same way. Same inputs (packages, wheels, epoch), same digest.

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
#: Debian architecture → (manylinux machine name, OCI platform fields).
MANYLINUX = {"amd64": "x86_64", "arm64": "aarch64"}
OCI_PLATFORM = {"amd64": {"architecture": "amd64", "os": "linux"},
                "arm64": {"architecture": "arm64", "os": "linux", "variant": "v8"}}
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


def host_arch() -> str:
    """This machine's Debian architecture (``amd64``, ``arm64``)."""
    return subprocess.run(["dpkg", "--print-architecture"], check=True, capture_output=True,
                          text=True).stdout.strip()


def wheels_for(work: Path, when: int, arch: str) -> Path:
    """The wheels of reloadd, its plugins and their dependencies for ``arch`` (CPython 3.11, Debian bookworm's).

    The project's own wheels are pure Python and built once; another architecture's dependencies are PyPI's
    binary wheels for it (manylinux 2.17+, which bookworm's glibc 2.36 runs), never compiled here.
    """
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(when)}
    wheels = work / f"wheels-{arch}"
    if wheels.exists():
        shutil.rmtree(wheels)
    if arch == host_arch():
        run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels), str(ROOT),
             *(str(ROOT / "plugins" / p) for p in PLUGINS)], env=env)
        return wheels
    own = work / "wheels-own"
    if own.exists():
        shutil.rmtree(own)
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(own), str(ROOT),
         *(str(ROOT / "plugins" / p) for p in PLUGINS)], env=env)
    machine = MANYLINUX[arch]
    platforms = [a for tag in ("manylinux2014", "manylinux_2_17", "manylinux_2_28") for a in
                 ("--platform", f"{tag}_{machine}")]
    run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", *platforms,
         "--python-version", "3.11", "--implementation", "cp", "--dest", str(wheels),
         *(str(w) for w in sorted(own.glob("*.whl")))], env=env)
    return wheels


def foreign_binaries(arch: str) -> None:
    """Let this machine run ``arch``'s programs (mmdebstrap's maintainer scripts, pip in the chroot).

    Debian's qemu-user-static registers its interpreters with binfmt_misc (flag F: the kernel opens the
    interpreter once, so it works inside a chroot); on a machine where binfmt_misc is not mounted yet, or the
    entry is disabled, this mounts and enables it.
    """
    if arch == host_arch():
        return
    entry = Path("/proc/sys/fs/binfmt_misc") / f"qemu-{MANYLINUX[arch]}"
    if not Path("/proc/sys/fs/binfmt_misc/register").exists():
        run(["mount", "-t", "binfmt_misc", "binfmt_misc", "/proc/sys/fs/binfmt_misc"])
    if not entry.exists() or "enabled" not in entry.read_text():
        run(["update-binfmts", "--enable", f"qemu-{MANYLINUX[arch]}"])
    if "enabled" not in entry.read_text():
        raise SystemExit(f"{entry} is not enabled: install qemu-user-static and binfmt-support (make deps)")


def rootfs(work: Path, when: int, arch: str) -> Path:
    target = work / f"rootfs-{arch}"
    if target.exists():
        shutil.rmtree(target)
    src, suite = sources()
    foreign_binaries(arch)
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(when)}
    run(["mmdebstrap", "--mode=root", "--variant=minbase", f"--architectures={arch}",
         f"--include={','.join(PACKAGES)}", "--quiet", suite, str(target), src], env=env)
    wheels = wheels_for(work, when, arch)
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


def _blobs_for(arch: str, layer: bytes, when: int, name: str) -> tuple[bytes, list[bytes]]:
    """One platform's image manifest and the blobs it names (config, gzipped layer)."""
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, compresslevel=6) as z:
        z.write(layer)
    compressed = gz.getvalue()
    created = datetime.datetime.fromtimestamp(when, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = _json({
        **OCI_PLATFORM[arch], "created": created,
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
    return manifest, [config, compressed]


def oci_archive(layers: dict[str, bytes], when: int, name: str) -> bytes:
    """An OCI image layout tar: ``index.json`` names ``name`` → an image index → one manifest per platform."""
    blobs: list[bytes] = []
    entries_of_index = []
    for arch, layer in layers.items():
        manifest, more = _blobs_for(arch, layer, when, name)
        blobs += [manifest, *more]
        entries_of_index.append({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                 "digest": _digest(manifest), "size": len(manifest), "platform": OCI_PLATFORM[arch]})
    image_index = _json({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                         "manifests": entries_of_index})
    blobs.append(image_index)
    index = _json({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.index.v1+json", "digest": _digest(image_index),
                       "size": len(image_index),
                       "annotations": {"org.opencontainers.image.ref.name": name,
                                       "io.containerd.image.name": name}}],
    })
    entries = {"oci-layout": _json({"imageLayoutVersion": "1.0.0"}), "index.json": index}
    for blob in blobs:
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
    ap.add_argument("--platforms", default="amd64,arm64", help="comma-separated Debian architectures")
    args = ap.parse_args()
    when = epoch() if args.epoch is None else args.epoch
    args.work.mkdir(parents=True, exist_ok=True)
    name = f"localhost/reloadd:{version()}"
    layers = {}
    for arch in args.platforms.split(","):
        if arch not in OCI_PLATFORM:
            raise SystemExit(f"unknown architecture {arch!r}: one of {', '.join(OCI_PLATFORM)}")
        layers[arch] = layer_tar(rootfs(args.work, when, arch), when)
    archive = oci_archive(layers, when, name)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(archive)
    index = json.loads(tarfile.open(args.out).extractfile("index.json").read())  # type: ignore[union-attr]
    print(f"wrote {args.out} ({len(archive) >> 20} MiB): {name} {index['manifests'][0]['digest']} "
          f"({', '.join(layers)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
