"""Plugin discovery through entry points, with errors that name the plugin."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._errors import PluginError
from .._suggest import did_you_mean

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["CONSUMER_GROUP", "CORE_SOURCES", "SOURCE_GROUP", "available", "load"]

CONSUMER_GROUP = "reloadd.consumers"
SOURCE_GROUP = "reloadd.sources"

CORE_SOURCES = {
    "inotify": "reloadd._sources.inotify:InotifySource",
    "rescan": "reloadd._sources.rescan:RescanSource",
    "signal": "reloadd._sources.signals:SignalSource",
}
"""The core's own sources, as ``pyproject.toml`` registers them in :data:`SOURCE_GROUP`: loaded by name without a
lookup. ``importlib.metadata`` is 2.7 MiB of modules (email, zipfile, csv...), which a Reloader embedded with its
consumers given needs for nothing else."""


def _entry_points(group: str) -> dict[str, EntryPoint]:
    from importlib.metadata import entry_points  # 2.7 MiB of modules: only when a plugin is looked up

    return {ep.name: ep for ep in entry_points(group=group)}


def available(group: str) -> list[str]:
    """Names registered in ``group``, sorted."""
    return sorted(_entry_points(group))


def load(group: str, name: str) -> Callable[..., Any]:
    """Load the factory registered as ``name`` in ``group``.

    Raises:
        PluginError: when no such plugin is installed, or it fails to import, or it is
            not callable; the message names the plugin and lists what is installed.
    """
    core = CORE_SOURCES.get(name) if group == SOURCE_GROUP else None
    if core is not None:
        module, _, attr = core.partition(":")
        return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
    eps = _entry_points(group)
    ep = eps.get(name)
    if ep is None:
        installed = ", ".join(sorted(eps)) or "none"
        raise PluginError(f"No plugin named {name!r}{did_you_mean(name, eps)} in entry-point group {group} "
                          f"(installed: {installed})")
    try:
        obj = ep.load()
    except Exception as exc:
        raise PluginError(f"Failed to load plugin {name!r} ({ep.value}): {type(exc).__name__}: {exc}") from exc
    if not callable(obj):
        raise PluginError(f"Plugin {name!r} ({ep.value}) is not callable")
    return obj  # type: ignore[no-any-return]
