"""OCI / Docker image formats: media types, references, platforms, and containerd's conventions.

Pure functions only. Where containerd's Go code decides a byte-level detail (JSON
encoding of synthesised manifests, gc label names, chain IDs) this follows it so the
result equals ``ctr images import``.
"""

from __future__ import annotations

import hashlib
import json
import platform as _platform
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ._client import Descriptor

__all__ = [
    "CONFIG_TYPES",
    "INDEX_TYPES",
    "MANIFEST_TYPES",
    "chain_ids",
    "children_of",
    "gc_labels",
    "go_json",
    "host_platform",
    "normalize_platform",
    "normalize_ref",
    "parse_platform",
    "platform_matches",
    "sha256_digest",
    "valid_reference",
]

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
CONFIG_TYPES = (OCI_CONFIG, DOCKER_CONFIG)

ANN_IMAGE_NAME = "io.containerd.image.name"
ANN_REF_NAME = "org.opencontainers.image.ref.name"


def sha256_digest(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def go_json(obj: Any) -> bytes:
    """Bytes equal to Go's ``json.Marshal`` for our (ordered) dicts: compact, ``<>&`` escaped."""
    s = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    for a, b in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        s = s.replace(a, b)
    return s.encode()


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """Snapshot chain IDs: ``c0 = d0``, ``cN = sha256(c(N-1) + " " + dN)``."""
    out: list[str] = []
    for d in diff_ids:
        out.append(d if not out else sha256_digest(f"{out[-1]} {d}".encode()))
    return out


# -- platforms -----------------------------------------------------------------------------------
def normalize_platform(os_: str, arch: str, variant: str = "") -> dict[str, str]:
    """containerd's ``platforms.Normalize`` for the common architectures."""
    arch, variant = (arch or "").lower(), (variant or "").lower()
    if arch in ("x86_64", "x86-64", "amd64"):
        arch, variant = "amd64", ("" if variant == "v1" else variant)
    elif arch in ("aarch64", "arm64"):
        arch, variant = "arm64", ("" if variant in ("8", "v8") else variant)
    elif arch in ("i386", "i686"):
        arch, variant = "386", ""
    elif arch in ("armhf",):
        arch, variant = "arm", "v7"
    elif arch == "arm" and variant in ("", "7"):
        variant = "v7"
    elif arch == "arm" and variant in ("5", "6", "8"):
        variant = "v" + variant
    p = {"architecture": arch, "os": (os_ or "").lower()}
    if variant:
        p["variant"] = variant
    return p


def parse_platform(spec: str) -> dict[str, str]:
    """``os/arch[/variant]`` (or ``arch`` alone, meaning linux) to a normalised platform.

    Raises:
        ValueError: on an empty or malformed specifier.
    """
    parts = spec.strip().split("/")
    if not all(parts) or not 1 <= len(parts) <= 3:
        raise ValueError(f"invalid platform {spec!r}; expected os/arch[/variant]")
    if len(parts) == 1:
        return normalize_platform("linux", parts[0])
    return normalize_platform(parts[0], parts[1], parts[2] if len(parts) == 3 else "")


def host_platform() -> dict[str, str]:
    """The platform images are unpacked for (this machine)."""
    return normalize_platform("linux", _platform.machine())


def platform_matches(p: Mapping[str, str] | None, want: Mapping[str, str]) -> bool:
    """Whether descriptor platform ``p`` satisfies ``want`` (no platform matches anything)."""
    if not p:
        return True
    q = normalize_platform(str(p.get("os", "")), str(p.get("architecture", "")), str(p.get("variant", "")))
    if q["os"] != want["os"] or q["architecture"] != want["architecture"]:
        return False
    return not want.get("variant") or q.get("variant", "") in ("", want["variant"])


# -- references ----------------------------------------------------------------------------------
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
    r"|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
)
_REFERENCE = re.compile(
    rf"^(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?$"
)


def valid_reference(ref: str) -> bool:
    """Whether ``ref`` is a syntactically valid image reference (docker/distribution grammar)."""
    if len(ref) > 512 or not _REFERENCE.match(ref):
        return False
    first, sep, _ = ref.partition("/")
    is_domain = sep and ("." in first or ":" in first or first == "localhost")
    return bool(is_domain) or first == first.lower()


def normalize_ref(ref: str) -> str:
    """``ParseDockerRef``: ``hello:v1`` → ``docker.io/library/hello:v1``; default tag ``latest``."""
    name, _, digest = ref.partition("@")
    tag = ""
    slash, colon = name.rfind("/"), name.rfind(":")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    first, _, rest = name.partition("/")
    if not rest or not (("." in first) or (":" in first) or first == "localhost" or first != first.lower()):
        domain, path = "docker.io", name
    else:
        domain, path = first, rest
    if domain == "index.docker.io":
        domain = "docker.io"
    if domain == "docker.io" and "/" not in path:
        path = "library/" + path
    if digest:
        return f"{domain}/{path}@{digest}"
    return f"{domain}/{path}:{tag or 'latest'}"


def ref_name_annotation(name: str) -> str:
    """``org.opencontainers.image.ref.name`` containerd writes for a normalised name (the tag)."""
    if "@" in name:
        return name[name.index("@") :]
    i = name.rfind(":")
    return name[i + 1 :] if i > name.rfind("/") else name


def repo_of(name: str) -> str:
    """``docker.io/library/hello:v1`` → ``docker.io/library/hello``."""
    name = name.split("@", 1)[0]
    i = name.rfind(":")
    return name[:i] if i > name.rfind("/") else name


# -- walking -------------------------------------------------------------------------------------
def children_of(desc: Descriptor, doc: Mapping[str, Any]) -> list[Descriptor]:
    """The children of an index or manifest document (raises on malformed JSON shapes)."""
    mt = desc.media_type or str(doc.get("mediaType", ""))
    if mt in INDEX_TYPES or (not mt and "manifests" in doc):
        return [Descriptor.from_json(m) for m in doc.get("manifests") or []]
    if mt in MANIFEST_TYPES or (not mt and "config" in doc):
        return [Descriptor.from_json(doc["config"]), *(Descriptor.from_json(x) for x in doc.get("layers") or [])]
    return []


def gc_labels(children: Sequence[Descriptor]) -> dict[str, str]:
    """containerd's ``SetChildrenLabels``: ``containerd.io/gc.ref.content.<kind>.<i>`` per child."""
    labels: dict[str, str] = {}
    counters: dict[str, int] = {}
    for c in children:
        if c.media_type in CONFIG_TYPES:
            key = "containerd.io/gc.ref.content.config"
        elif c.media_type in MANIFEST_TYPES:
            key = "containerd.io/gc.ref.content.m."
        elif "layer" in c.media_type or "rootfs.diff" in c.media_type:
            key = "containerd.io/gc.ref.content.l."
        else:
            key = "containerd.io/gc.ref.content."
        i = counters.get(key, 0)
        counters[key] = i + 1
        if i > 0 or key.endswith("."):
            key = f"{key}{i}"
        labels[key] = c.digest
    return labels
