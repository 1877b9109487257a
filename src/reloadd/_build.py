"""Building a configured consumer: its plugin's factory, checked, and its path filter.

Shared by :class:`~reloadd.Reloader` and ``reloadd plan``, so both see the very same consumer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from ._config import ConsumerConfig
from ._consumer import Consumer, ConsumerContext
from ._errors import ConfigError, PluginError
from ._filters import PathFilter
from ._plugins import CONSUMER_GROUP, load
from ._types import PathRecord

__all__ = ["build_consumer", "path_filter"]


def build_consumer(
    cc: ConsumerConfig,
    records: Mapping[Path, PathRecord],
    private: Path,
    config_file: Path | None,
    trigger: Callable[[Iterable[Path] | None], None] = lambda paths: None,
) -> Consumer:
    """Create the consumer of a ``[[consumer]]`` table through its plugin's factory.

    Raises:
        ConfigError: the plugin refused its options.
        PluginError: the plugin is missing, its factory failed, or it returned no :class:`Consumer`.
    """
    factory = load(CONSUMER_GROUP, cc.plugin)
    ctx = ConsumerContext(
        name=cc.name,
        paths=cc.paths,
        options=cc.options,
        state_dir=private,
        records=records,
        trigger=trigger,
        logger=logging.getLogger(f"reloadd.consumer.{cc.name}"),
        config_file=config_file,
    )
    try:
        consumer = factory(ctx)
    except ConfigError:
        raise
    except Exception as exc:
        raise PluginError(f"Plugin {cc.plugin!r} failed to create consumer {cc.name!r}: {exc}") from exc
    if not isinstance(consumer, Consumer):
        raise PluginError(f"Plugin {cc.plugin!r} returned {type(consumer).__name__}, not a Consumer")
    if getattr(consumer, "name", None) != cc.name:
        consumer.name = cc.name
    if cc.concurrency is not None:
        consumer.concurrency = cc.concurrency
    return consumer


def path_filter(consumer: Consumer, cc: ConsumerConfig | None) -> PathFilter:
    """The path filter of a consumer: its roots with the table's include/exclude rules."""
    return PathFilter(
        roots=tuple(Path(r) for r in consumer.roots),
        include=cc.include if cc else (),
        exclude=cc.exclude if cc else (),
        ignore_defaults=cc.ignore_defaults if cc else True,
        recursive=cc.recursive if cc else True,
    )
