"""Building consumers: configured ones from their plugin, embedded ones bound to the same context.

Whether a consumer comes from a ``[[consumer]]`` table or is an object the host passed
in, it ends with the same things: a record store, a private directory, a trigger scoped
to it, its logger, and a :class:`~reloadd.ConsumerConfig` the engine builds its filter,
timing, order and groups from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .._config import ConsumerConfig
from .._consumer import Consumer, ConsumerContext
from .._errors import ConfigError, PluginError
from .._filters import PathFilter
from .._provides import provisions_for
from .._state._records import RecordStore
from .._types import DriftMode, PathRecord
from ._plugins import CONSUMER_GROUP, load

__all__ = [
    "PrivateDirs", "RemovalHeld", "Trigger", "bind", "build_consumer", "embedded_config", "owner_test", "path_filter",
    "records_for",
]

Trigger = Callable[[Iterable[Path] | None], None]
RemovalHeld = Callable[[Path], str | None]


def records_for(state_dir: Path | None, name: str) -> RecordStore:
    """The consumer's record store: loaded from ``state_dir``, or in memory when it is ``None``."""
    if state_dir is None:
        return RecordStore(None)  # in memory: nothing to load, nothing to persist
    parent = state_dir / "consumers"
    parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    store = RecordStore(parent / name)
    store.load()
    return store


class PrivateDirs:
    """Plugins' own directories: under their state, or in one temporary folder without persistence."""

    def __init__(self) -> None:
        self._scratch: Path | None = None

    def get(self, records: RecordStore, name: str) -> Path:
        """The private directory (0700) of consumer ``name``."""
        if records.directory is not None:
            private = records.directory / "plugin"
        else:
            if self._scratch is None:
                import tempfile  # with shutil, 0.9 MiB of modules: only without persistence

                self._scratch = Path(tempfile.mkdtemp(prefix="reloadd-"))
            private = self._scratch / name
        private.mkdir(mode=0o700, exist_ok=True)
        return private

    def remove(self) -> None:
        """Remove the temporary folder, if one was made."""
        if self._scratch is not None:
            import shutil

            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


def build_consumer(
    cc: ConsumerConfig,
    records: Mapping[Path, PathRecord],
    private: Path,
    config_file: Path | None,
    trigger: Trigger = lambda paths: None,
    removal_held: RemovalHeld = lambda path: None,
    health_changed: Callable[[], None] = lambda: None,
) -> Consumer:
    """Create the consumer of a ``[[consumer]]`` table through its plugin's factory.

    Shared by :class:`~reloadd.Reloader` and ``reloadd plan``, so both see the very same consumer.

    Raises:
        ConfigError: the plugin rejected its options; the message starts with the config file, so a
            plugin's own ``consumer 'x' options: key 'k': ...`` reads like the core's errors.
        PluginError: the plugin is missing, failed, or returned something that is not a consumer.
    """
    try:
        factory = load(CONSUMER_GROUP, cc.plugin)
    except PluginError as exc:
        where = f"{config_file}: " if config_file is not None else ""
        raise PluginError(f"{where}consumer {cc.name!r}: {exc}") from exc
    ctx = ConsumerContext(
        name=cc.name,
        paths=cc.paths,
        options=cc.options,
        state_dir=private,
        records=records,
        trigger=trigger,
        logger=logging.getLogger(f"reloadd.consumer.{cc.name}"),
        config_file=config_file,
        removal_held=removal_held,
        drift=cc.drift,
        health_changed=health_changed,
    )
    try:
        consumer = factory(ctx)
    except ConfigError as exc:
        raise _in_file(exc, config_file) from exc
    except Exception as exc:
        raise PluginError(f"Plugin {cc.plugin!r} failed to create consumer {cc.name!r}: {exc}") from exc
    if not isinstance(consumer, Consumer):
        raise PluginError(f"Plugin {cc.plugin!r} returned {type(consumer).__name__}, not a Consumer")
    if getattr(consumer, "name", None) != cc.name:
        consumer.name = cc.name
    if cc.concurrency is not None:
        consumer.concurrency = cc.concurrency
    return consumer


def _in_file(exc: ConfigError, config_file: Path | None) -> ConfigError:
    """``exc`` with the config file in front, unless there is none or the plugin named it already."""
    text = str(exc)
    if config_file is None or text.startswith(str(config_file)):
        return exc
    return ConfigError(f"{config_file}: {text}")


def path_filter(consumer: Consumer, cc: ConsumerConfig) -> PathFilter:
    """The path filter of a consumer: its roots with the table's include/exclude rules."""
    return PathFilter(
        roots=tuple(Path(r) for r in consumer.roots),
        include=cc.include,
        exclude=cc.exclude,
        ignore_defaults=cc.ignore_defaults,
        recursive=cc.recursive,
    )


def owner_test(consumer: Consumer, filt: PathFilter) -> Callable[[str], bool]:
    """Whether a path string is the consumer's business: its filter, then ``accepts`` (raising counts as no).

    Safe from a worker thread (prune safety judges there): nothing is memoised, unlike the engine's
    ``Slot.owns``, whose memo only the event loop writes.
    """
    def owned(key: str) -> bool:
        if not filt.matches(key):
            return False
        try:
            return bool(consumer.accepts(Path(key)))
        except Exception:  # the engine logs a failing accepts(); here it only means "not a file of ours"
            return False

    return owned


def embedded_config(consumer: Consumer) -> ConsumerConfig:
    """The ``[[consumer]]`` table an embedder's object would have had, from its attributes.

    Optional attributes, with the table's defaults: ``include``, ``exclude``,
    ``recursive``, ``ignore_defaults``, ``quiet``, ``max_delay``, ``max_hold``, ``after``, ``group``
    (globs; a callable group is read by the engine directly), ``drift`` (else its context's).
    """
    def attr(key: str, default: Any) -> Any:
        value = getattr(consumer, key, None)
        return default if value is None else value

    group = attr("group", ())
    return ConsumerConfig(
        name=consumer.name,
        plugin=f"<embedded {type(consumer).__qualname__}>",
        paths=tuple(Path(r) for r in consumer.roots),
        include=tuple(attr("include", ())),
        exclude=tuple(attr("exclude", ())),
        recursive=bool(attr("recursive", True)),
        ignore_defaults=bool(attr("ignore_defaults", True)),
        quiet=attr("quiet", None),
        max_delay=attr("max_delay", None),
        max_hold=attr("max_hold", None),
        after=tuple(attr("after", ())),
        group=() if callable(group) else tuple((g,) if isinstance(g, str) else tuple(g) for g in group),
        drift=DriftMode(attr("drift", getattr(getattr(consumer, "ctx", None), "drift", DriftMode.CORRECT))),
    )


def arrives_at_once(consumer: Consumer) -> bool:
    """Whether ``consumer`` hands over a file moved into place at once (``BaseConsumer.arrival_at_once``)."""
    return bool(getattr(consumer, "arrival_at_once", False))


def group_function(consumer: Consumer) -> Callable[[Path], str | None] | None:
    """An embedder's callable ``group`` (:class:`~reloadd.Tunable`), if it declared one."""
    group = getattr(consumer, "group", None)
    return group if callable(group) else None


def bind(consumer: Consumer, records: RecordStore, trigger: Trigger,
         removal_held: RemovalHeld = lambda path: None, health_changed: Callable[[], None] = lambda: None) -> None:
    """Give an embedder's :class:`BaseConsumer` what a configured one gets: records, trigger, logger."""
    ctx = getattr(consumer, "ctx", None)
    if not isinstance(ctx, ConsumerContext):
        return
    ctx.records = records
    ctx.trigger = trigger
    ctx.removal_held = removal_held
    ctx.health_changed = health_changed
    if ctx.logger.name == "reloadd.consumer":
        ctx.logger = logging.getLogger(f"reloadd.consumer.{consumer.name}")
        if getattr(consumer, "log", None) is not None:
            consumer.log = ctx.logger  # type: ignore[attr-defined]


def share_provisions(consumers: Iterable[Consumer]) -> None:
    """Let each consumer built with a :class:`ConsumerContext` read what the others provide
    (:attr:`ConsumerContext.provided`, see :class:`~reloadd.Providing`)."""
    every = list(consumers)
    for consumer in every:
        ctx = getattr(consumer, "ctx", None)
        if isinstance(ctx, ConsumerContext):
            ctx.provided = provisions_for(consumer, every)
