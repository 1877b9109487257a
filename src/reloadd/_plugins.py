"""Plugin discovery through entry points, with errors that name the plugin."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from ._errors import PluginError
from ._suggest import did_you_mean

__all__ = ["CONSUMER_GROUP", "SOURCE_GROUP", "available", "load"]

CONSUMER_GROUP = "reloadd.consumers"
SOURCE_GROUP = "reloadd.sources"


def _entry_points(group: str) -> dict[str, EntryPoint]:
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
