"""Deterministic tiny images for tests: OCI archives, docker archives, compressed variants.

Everything is generated in Python from a seed, so the same call gives byte-identical
files (fixed tar headers, gzip mtime 0), and digests can be asserted.

Example::

    img = ImageSpec("docker.io/library/hello:v1", platforms=("linux/amd64", "linux/arm64"))
    built = write_oci_archive(tmp_path / "hello.tar", [img])
    zst = compress(tmp_path / "hello.tar", "zst")        # hello.tar.zst
    built[0].target.digest                                 # what the image record points at
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import json
import random
import shutil
import tarfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "COMPRESSIONS",
    "BuiltImage",
    "Descriptor",
    "ImageSpec",
    "PlatformImage",
    "build_image",
    "compress",
    "deterministic_tar",
    "write_docker_archive",
    "write_oci_archive",
    "write_oci_layout",
]

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"

COMPRESSIONS = ("gz", "zst", "bz2", "lz4")
"""File compressions :func:`compress` knows (suffixes ``.gz``, ``.zst``, ``.bz2``, ``.lz4``)."""


def _sha(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=False).encode()


@dataclass(frozen=True)
class Descriptor:
    """An OCI descriptor of a blob that was generated."""

    media_type: str
    digest: str
    size: int

    def to_json(self) -> dict[str, Any]:
        """The OCI JSON form (without annotations/platform)."""
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


@dataclass(frozen=True)
class ImageSpec:
    """What to generate.

    Attributes:
        name: Full reference, e.g. ``docker.io/library/hello:v1`` (used for the
            ``io.containerd.image.name`` annotation and docker ``RepoTags``).
        platforms: ``os/arch[/variant]`` list; more than one makes an image index.
        layers: Layers per platform.
        layer_size: Bytes of pseudo-random file content per layer.
        seed: Varies the content (two specs with the same seed share layers).
        layer_compression: ``gzip``, ``zstd`` or ``none`` for layer blobs.
        extra_tags: More names for the same image (docker ``RepoTags`` / more index entries).
    """

    name: str
    platforms: tuple[str, ...] = ("linux/amd64",)
    layers: int = 2
    layer_size: int = 4096
    seed: str = ""
    layer_compression: str = "gzip"
    extra_tags: tuple[str, ...] = ()


@dataclass
class PlatformImage:
    """One platform's manifest, config and layers."""

    platform: str
    manifest: Descriptor
    config: Descriptor
    layers: list[Descriptor]
    diff_ids: list[str]

    @property
    def chain_ids(self) -> list[str]:
        """The snapshot chain IDs containerd computes from the diff IDs."""
        out: list[str] = []
        for d in self.diff_ids:
            out.append(d if not out else _sha(f"{out[-1]} {d}".encode()))
        return out


@dataclass
class BuiltImage:
    """A generated image and all its blobs.

    Attributes:
        spec: What it was built from.
        target: The descriptor image records point at (a manifest, or an index when
            multi-platform) — for OCI archives. Docker archives get a manifest containerd
            synthesises, so compare with what containerd reports instead.
        platforms: Per-platform parts.
        blobs: digest → bytes of every blob (layers, configs, manifests, index).
    """

    spec: ImageSpec
    target: Descriptor
    platforms: list[PlatformImage]
    blobs: dict[str, bytes] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """The primary name and extra tags."""
        return [self.spec.name, *self.spec.extra_tags]

    @property
    def config_digests(self) -> list[str]:
        """Config digests, one per platform."""
        return [p.config.digest for p in self.platforms]


def deterministic_tar(files: Iterable[tuple[str, bytes]]) -> bytes:
    """A tar of regular files with fixed headers (mtime 0, root-owned, mode 0644)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in files:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = len(data), 0o644, 0, 0, 0, "", ""
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _compress_layer(raw: bytes, kind: str) -> tuple[bytes, str]:
    if kind == "gzip":
        return gzip.compress(raw, compresslevel=1, mtime=0), OCI_LAYER + "+gzip"
    if kind == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=1).compress(raw), OCI_LAYER + "+zstd"
    if kind == "none":
        return raw, OCI_LAYER
    raise ValueError(f"unknown layer compression {kind!r}")


def _platform_dict(p: str) -> dict[str, str]:
    parts = p.split("/")
    d = {"architecture": parts[1], "os": parts[0]}
    if len(parts) > 2:
        d["variant"] = parts[2]
    return d


def build_image(spec: ImageSpec) -> BuiltImage:
    """Generate the blobs of ``spec`` (deterministic in ``spec``)."""
    blobs: dict[str, bytes] = {}
    plats: list[PlatformImage] = []
    for plat in spec.platforms:
        rng = random.Random(f"{spec.seed}|{plat}")
        layers: list[Descriptor] = []
        diff_ids: list[str] = []
        for i in range(spec.layers):
            raw = deterministic_tar(
                [(f"layer{i}/data.bin", rng.randbytes(spec.layer_size)), (f"layer{i}/platform", plat.encode())]
            )
            blob, mt = _compress_layer(raw, spec.layer_compression)
            diff_ids.append(_sha(raw))
            blobs[_sha(blob)] = blob
            layers.append(Descriptor(mt, _sha(blob), len(blob)))
        pd = _platform_dict(plat)
        config = _json(
            {
                "architecture": pd["architecture"],
                "os": pd["os"],
                **({"variant": pd["variant"]} if "variant" in pd else {}),
                "config": {"Cmd": ["/layer0/data.bin"], "Labels": {"seed": spec.seed}},
                "rootfs": {"type": "layers", "diff_ids": diff_ids},
                "history": [{"created_by": f"reloadd test layer {i}"} for i in range(spec.layers)],
            }
        )
        blobs[_sha(config)] = config
        cdesc = Descriptor(OCI_CONFIG, _sha(config), len(config))
        manifest = _json(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": cdesc.to_json(),
                "layers": [x.to_json() for x in layers],
            }
        )
        blobs[_sha(manifest)] = manifest
        plats.append(
            PlatformImage(plat, Descriptor(OCI_MANIFEST, _sha(manifest), len(manifest)), cdesc, layers, diff_ids)
        )
    if len(plats) == 1:
        target = plats[0].manifest
    else:
        index = _json(
            {
                "schemaVersion": 2,
                "mediaType": OCI_INDEX,
                "manifests": [{**p.manifest.to_json(), "platform": _platform_dict(p.platform)} for p in plats],
            }
        )
        blobs[_sha(index)] = index
        target = Descriptor(OCI_INDEX, _sha(index), len(index))
    return BuiltImage(spec, target, plats, blobs)


def _ref_name(name: str) -> str:
    if "@" in name:
        return name.split("@", 1)[1]
    last = name.rsplit("/", 1)[-1]
    return last.rsplit(":", 1)[1] if ":" in last else "latest"


def _oci_entries(built: Sequence[BuiltImage], omit: Callable[[str], bool]) -> list[tuple[str, bytes]]:
    manifests = []
    for b in built:
        for n in b.names:
            manifests.append(
                {
                    **b.target.to_json(),
                    "annotations": {"io.containerd.image.name": n, "org.opencontainers.image.ref.name": _ref_name(n)},
                }
            )
    index = _json({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests})
    entries = [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index)]
    seen: set[str] = set()
    for b in built:
        for digest, data in sorted(b.blobs.items()):
            if digest in seen or omit(digest):
                continue
            seen.add(digest)
            entries.append(("blobs/sha256/" + digest.split(":", 1)[1], data))
    return entries


def _omitter(
    built: Sequence[BuiltImage], omit: Iterable[str], missing_platforms: Iterable[str]
) -> Callable[[str], bool]:
    gone = set(omit)
    for b in built:
        for p in b.platforms:
            if p.platform in set(missing_platforms):
                gone |= {p.manifest.digest, p.config.digest, *(x.digest for x in p.layers)}
    return gone.__contains__


def write_oci_archive(
    path: Path,
    images: Sequence[ImageSpec | BuiltImage],
    *,
    omit: Iterable[str] = (),
    missing_platforms: Iterable[str] = (),
) -> list[BuiltImage]:
    """Write an OCI image-layout tarball holding ``images``.

    Args:
        path: Output ``.tar``.
        images: Specs (built here) or already built images.
        omit: Blob digests to leave out (a tar whose index points at a missing blob).
        missing_platforms: Platforms whose manifest, config and layers are left out while
            the index still lists them (like ``ctr export`` of one platform).
    """
    built = [i if isinstance(i, BuiltImage) else build_image(i) for i in images]
    entries = _oci_entries(built, _omitter(built, omit, missing_platforms))
    path.write_bytes(deterministic_tar(entries))
    return built


def write_oci_layout(directory: Path, images: Sequence[ImageSpec | BuiltImage]) -> list[BuiltImage]:
    """Write an OCI image layout directory (for ``skopeo copy oci:<dir>``)."""
    built = [i if isinstance(i, BuiltImage) else build_image(i) for i in images]
    for name, data in _oci_entries(built, lambda d: False):
        p = directory / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return built


def write_docker_archive(path: Path, images: Sequence[ImageSpec | BuiltImage]) -> list[BuiltImage]:
    """Write a ``docker save``-style archive (``manifest.json``, ``<id>/layer.tar``, ``repositories``).

    Only the first platform of each image is used (docker archives are single-platform).
    Layers keep the spec's compression (``none`` is what ``docker save`` writes).
    """
    built = [i if isinstance(i, BuiltImage) else build_image(i) for i in images]
    entries: dict[str, bytes] = {}
    manifest = []
    repositories: dict[str, dict[str, str]] = {}
    for b in built:
        p = b.platforms[0]
        cfg_hex = p.config.digest.split(":", 1)[1]
        entries[f"{cfg_hex}.json"] = b.blobs[p.config.digest]
        layer_paths = []
        for layer in p.layers:
            lid = layer.digest.split(":", 1)[1]
            entries[f"{lid}/layer.tar"] = b.blobs[layer.digest]
            entries[f"{lid}/VERSION"] = b"1.0"
            entries[f"{lid}/json"] = _json({"id": lid})
            layer_paths.append(f"{lid}/layer.tar")
        tags = [_docker_tag(n) for n in b.names]
        manifest.append({"Config": f"{cfg_hex}.json", "RepoTags": tags, "Layers": layer_paths})
        for t in tags:
            repo, tag = t.rsplit(":", 1)
            repositories.setdefault(repo, {})[tag] = p.layers[-1].digest.split(":", 1)[1]
    entries["manifest.json"] = _json(manifest)
    entries["repositories"] = _json(repositories)
    path.write_bytes(deterministic_tar(sorted(entries.items())))
    return built


def _docker_tag(name: str) -> str:
    """docker save writes familiar names (``hello:v1`` for ``docker.io/library/hello:v1``)."""
    for prefix in ("docker.io/library/", "docker.io/"):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def compress(path: Path, kind: str, *, dest: Path | None = None) -> Path:
    """Compress ``path`` with ``gz``, ``zst``, ``bz2`` or ``lz4`` (streamed, deterministic).

    Returns:
        The new file, ``<path>.<kind>`` unless ``dest`` is given.
    """
    out = dest or path.with_name(f"{path.name}.{kind}")
    with open(path, "rb") as src, open(out, "wb") as raw:
        if kind == "gz":
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=1, mtime=0) as z:
                shutil.copyfileobj(src, z, 1 << 20)
        elif kind == "zst":
            import zstandard

            zstandard.ZstdCompressor(level=3).copy_stream(src, raw)
        elif kind == "bz2":
            comp = bz2.BZ2Compressor(9)
            while chunk := src.read(1 << 20):
                raw.write(comp.compress(chunk))
            raw.write(comp.flush())
        elif kind == "lz4":
            import lz4.frame  # type: ignore[import-untyped]  # lz4 ships no type information

            with lz4.frame.LZ4FrameFile(raw, mode="wb") as z:
                shutil.copyfileobj(src, z, 1 << 20)
        else:
            raise ValueError(f"unknown compression {kind!r}; expected one of {COMPRESSIONS}")
    return out
