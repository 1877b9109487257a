"""Reusable test infrastructure: a private containerd, local registries, generated images.

Import from here::

    from tests.infra import private_containerd, local_registry, push_image, ImageSpec, write_oci_archive
"""

from .containerd import Containerd, ContainerdError, private_containerd, unmount_under
from .images import (
    COMPRESSIONS,
    BuiltImage,
    Descriptor,
    ImageSpec,
    PlatformImage,
    build_image,
    compress,
    deterministic_tar,
    write_docker_archive,
    write_oci_archive,
    write_oci_layout,
)
from .registry import AccessLogEntry, Registry, RegistryError, local_registries, local_registry, push_image

__all__ = [
    "COMPRESSIONS",
    "AccessLogEntry",
    "BuiltImage",
    "Containerd",
    "ContainerdError",
    "Descriptor",
    "ImageSpec",
    "PlatformImage",
    "Registry",
    "RegistryError",
    "build_image",
    "compress",
    "deterministic_tar",
    "local_registries",
    "local_registry",
    "private_containerd",
    "push_image",
    "unmount_under",
    "write_docker_archive",
    "write_oci_archive",
    "write_oci_layout",
]
