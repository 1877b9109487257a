"""Reusable test infrastructure: a private containerd, local registries, generated images.

Import from here::

    from tests.infra import private_containerd, local_registry, push_image, ImageSpec, write_oci_archive
"""

from .busybox import BUSYBOX, CRASH, PAUSE, SERVE, busybox_image
from .containerd import (
    RELEASES,
    Containerd,
    ContainerdError,
    NodeCri,
    Release,
    containerd_config,
    get_release,
    private_containerd,
    releases_under_test,
    unmount_under,
)
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
    "BUSYBOX",
    "COMPRESSIONS",
    "CRASH",
    "PAUSE",
    "RELEASES",
    "SERVE",
    "AccessLogEntry",
    "BuiltImage",
    "Containerd",
    "ContainerdError",
    "Descriptor",
    "ImageSpec",
    "NodeCri",
    "PlatformImage",
    "Registry",
    "RegistryError",
    "Release",
    "build_image",
    "busybox_image",
    "compress",
    "containerd_config",
    "deterministic_tar",
    "get_release",
    "local_registries",
    "local_registry",
    "private_containerd",
    "push_image",
    "releases_under_test",
    "unmount_under",
    "write_docker_archive",
    "write_oci_archive",
    "write_oci_layout",
]
