"""Registry host names: the only strings ever turned into paths under ``hosts_dir``.

A host is checked against the domain grammar of the distribution reference
(``reference.DomainRegexp``: dot-separated labels of letters, digits and inner
hyphens, an optional numeric port) *before* any path is built from it, so ``/``,
``..``, NUL, spaces and schemes can never reach the file system.
"""

from __future__ import annotations

import re

__all__ = ["DEFAULT_DIR", "host_dir_name", "is_valid_host", "split_location", "upstream_server"]

_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = re.compile(rf"{_LABEL}(?:\.{_LABEL})*(?::(?P<port>[0-9]{{1,5}}))?")

DEFAULT_DIR = "_default"
"""containerd's catch-all host directory (k3s's ``"*"`` mirror)."""


def is_valid_host(host: str) -> bool:
    """Whether ``host`` is a plain ``host[:port]`` that is safe as a directory name."""
    m = _HOST.fullmatch(host)
    if m is None or len(host) > 253 + 6:
        return False
    port = m.group("port")
    return port is None or 0 < int(port) <= 65535


def split_location(location: str) -> tuple[str, str]:
    """Split ``host[:port][/path]`` into host and path (``""`` or ``"/ns/..."``)."""
    host, sep, rest = location.partition("/")
    return host, (sep + rest) if sep else ""


def host_dir_name(host: str) -> str:
    """The directory containerd reads for ``host``: the host itself, ``host:port`` included.

    containerd looks up ``host_port_``, then ``host:port``, then ``_default``; ``host:port``
    is read by every release (``_port_`` only since 1.7 docs), so that form is written.

    Raises:
        ValueError: when ``host`` is not a valid ``host[:port]`` (never build a path from it).
    """
    if host == DEFAULT_DIR:
        return host
    if not is_valid_host(host):
        raise ValueError(f"not a valid registry host[:port]: {host!r}")
    return host


def upstream_server(host: str) -> str:
    """The host containerd contacts for a namespace when no ``server`` is set (docker.io's quirk)."""
    return "registry-1.docker.io" if host == "docker.io" else host
