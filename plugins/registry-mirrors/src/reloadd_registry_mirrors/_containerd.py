"""Check that containerd will actually read what is written under ``hosts_dir``.

containerd's CRI plugin reads ``hosts.toml`` on every pull, but only from the roots in
its ``registry.config_path`` (empty by default in 1.6/1.7: one edit and one restart
needed, once). For a host, the first root with *any* match wins, a match being
``host_port_``, ``host:port`` or ``_default`` in that order; roots are never merged.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._hosts import DEFAULT_DIR

__all__ = ["ContainerdCheck", "check_config", "shadowing"]

_V3_DEFAULT = "/etc/containerd/certs.d:/etc/docker/certs.d"


@dataclass(slots=True)
class ContainerdCheck:
    """Result of :func:`check_config`.

    Attributes:
        warnings: Human-readable problems (each says what to change).
        roots_before: Roots containerd consults before ``hosts_dir`` (they can shadow it).
        reads_hosts_dir: Whether ``hosts_dir`` is one of containerd's roots.
    """

    warnings: list[str] = field(default_factory=list)
    roots_before: list[Path] = field(default_factory=list)
    reads_hosts_dir: bool = False


def _dig(doc: dict[str, Any], *keys: str) -> Any:
    node: Any = doc
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def check_config(config_file: Path, hosts_dir: Path) -> ContainerdCheck:
    """Read containerd's config.toml and check its ``config_path`` against ``hosts_dir``."""
    result = ContainerdCheck()
    try:
        doc = tomllib.loads(config_file.read_text())
    except FileNotFoundError:
        result.warnings.append(f"containerd config {config_file} not found; cannot check that it reads {hosts_dir}")
        return result
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        result.warnings.append(f"cannot read containerd config {config_file}: {exc}")
        return result
    version = doc.get("version", 1)
    if version == 3:
        table_name = 'plugins."io.containerd.cri.v1.images".registry'
        registry = _dig(doc, "plugins", "io.containerd.cri.v1.images", "registry")
    elif version == 2:
        table_name = 'plugins."io.containerd.grpc.v1.cri".registry'
        registry = _dig(doc, "plugins", "io.containerd.grpc.v1.cri", "registry")
    else:
        table_name = "plugins.cri.registry"
        registry = _dig(doc, "plugins", "cri", "registry")
    registry = registry if isinstance(registry, dict) else {}
    config_path = registry.get("config_path") or ""
    legacy = [k for k in ("mirrors", "configs") if registry.get(k)]
    if not config_path and version == 3 and not legacy:
        config_path = _V3_DEFAULT
    if not isinstance(config_path, str) or not config_path:
        result.warnings.append(
            f'containerd config {config_file} does not set config_path: add config_path = "{hosts_dir}" to '
            f"[{table_name}] and restart containerd once; after that, changes apply without a restart"
        )
        return result
    if legacy and version != 3:
        result.warnings.append(
            f"containerd config {config_file} sets {table_name}.{legacy[0]} next to config_path, "
            "which containerd refuses at start-up: move those settings into hosts.toml files"
        )
    target = hosts_dir.resolve()
    for root in config_path.split(os.pathsep):
        if not root:
            continue
        if Path(root).resolve() == target:
            result.reads_hosts_dir = True
            break
        result.roots_before.append(Path(root))
    if not result.reads_hosts_dir:
        result.roots_before.clear()
        result.warnings.append(
            f'containerd config {config_file} has config_path = "{config_path}", which does not include '
            f"{hosts_dir}: add it to [{table_name}] config_path and restart containerd once"
        )
    return result


def _candidates(name: str) -> list[str]:
    host, sep, port = name.rpartition(":")
    out = [f"{host}_{port}_"] if sep else []
    return [*out, name, DEFAULT_DIR]


def shadowing(hosts_dir: Path, roots_before: Iterable[Path], names: Iterable[str]) -> list[str]:
    """Warnings for rendered host directories that containerd would not read.

    A directory is shadowed by any match (``host_port_``, ``host:port``, ``_default``) in a root
    listed earlier in ``config_path``, or by a ``host_port_`` directory next to it.
    """
    roots = list(roots_before)
    warnings = []
    for name in names:
        if name == DEFAULT_DIR:
            continue
        for root in roots:
            hit = next((c for c in _candidates(name) if (root / c).exists()), None)
            if hit is not None:
                warnings.append(
                    f"{root / hit} shadows {hosts_dir / name}: containerd uses the first config_path root "
                    "with any match, so the rendered mirrors are not used"
                )
                break
        else:
            first = _candidates(name)[0]
            if first != name and (hosts_dir / first).exists():
                warnings.append(f"{hosts_dir / first} shadows {hosts_dir / name}: containerd reads host_port_ first")
    return warnings
