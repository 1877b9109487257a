"""The configuration file: one TOML document, parsed once into frozen values.

```toml
[reloadd]
state_dir = "/var/lib/reloadd"
rescan_interval = "15s"
full_rescan_interval = "60s"
quiet = "50ms"
max_delay = "5s"

[[consumer]]
name = "images"
plugin = "containerd-images"
paths = ["/var/lib/rancher/k3s/agent/images"]
exclude = ["*.partial"]
[consumer.options]
address = "/run/containerd/containerd.sock"
```
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._errors import ConfigError
from ._options import Options
from ._order import check_after
from ._types import DriftMode

__all__ = ["Config", "ConsumerConfig", "load_config", "parse_config"]

# Ranges beyond "finite, 0..MAX_DURATION" that every duration already gets (see _options).
MAX_QUIET = 3600.0
"""A quiet period longer than an hour means changes are never seen to settle in practice."""
MIN_RESCAN_INTERVAL = 0.1
"""Below this a stat walk of every root would run back to back, burning a core."""
MIN_READY_MAX_AGE = 1.0
"""Below this any path that is merely queued makes /readyz fail."""
MAX_CONCURRENCY = 1024
"""Batches in flight per consumer; each one may hold a process or a connection."""


@dataclass(frozen=True)
class ConsumerConfig:
    """One ``[[consumer]]`` table.

    Attributes:
        name: Names the consumer's queue, state, logs and metrics; unique in the file.
        plugin: The plugin's name in the ``reloadd.consumers`` entry-point group (``containerd-images``,
            ``registry-mirrors``, ``kube-manifests``, ``exec`` or a third-party one).
        paths: Files or folders to watch (folders recursively); relative paths resolve against the
            config file's folder. A plugin may derive its own (``registry-mirrors``).
        include: Globs a path (under its root) or file name must match to be handed over (empty: all).
        exclude: Globs of paths to leave alone.
        recursive: Watch folders recursively (false: only the files directly in each folder).
        ignore_defaults: Skip editor droppings (``*.swp``, ``*.swx``, ``*~``, ``4913``, ``.#*``, ``#*#``,
            ``*.tmp``: ``reloadd.DEFAULT_IGNORES``).
        quiet: This consumer's ``[reloadd] quiet``.
        max_delay: This consumer's ``[reloadd] max_delay``.
        max_hold: This consumer's ``[reloadd] max_hold``.
        concurrency: Batches in flight at once (one per path always); overrides the plugin's own value.
        after: Consumers whose work already seen (settling, queued, in flight) this one waits for, live and
            at start-up; unknown names and cycles are errors.
        group: Paths that belong together: each entry, a glob or a list of globs, is one group whose
            members settling at the same time are handed over in one batch.
        drift: What a far-side source's drift does: ``correct`` hands the file over again, ``detect``
            only reports it (status, WARNING, event), ``off`` runs no far-side source.
        options: The plugin's own table ``[consumer.options]`` (see the plugin options reference).
    """

    name: str
    plugin: str
    paths: tuple[Path, ...] = ()
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    recursive: bool = True
    ignore_defaults: bool = True
    quiet: float | None = None
    max_delay: float | None = None
    max_hold: float | None = None
    concurrency: int | None = None
    after: tuple[str, ...] = ()
    group: tuple[tuple[str, ...], ...] = ()
    drift: DriftMode = DriftMode.CORRECT
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    """The whole configuration. Durations are seconds.

    Attributes:
        state_dir: Where acknowledged state is kept (0700); ``None`` (``state_dir = ""``
            in the file) keeps it in memory only: nothing is persisted or locked, a
            restart hands every path over again, and plugins get a temporary private
            directory removed on close.
        rescan_interval: Seconds between stat walks; 0 disables them.
        full_rescan_interval: Every file is stat-ed by a rescan at least this often. In the
            directories a live inotify watch covers (on local file systems) a periodic
            rescan stats the files of its share of the directories, in turn, and lists
            the others only when their names changed; what no watch covers is
            stat-ed on every rescan. At most ``rescan_interval``: every rescan is full.
        quiet: Seconds without events before a path counts as settled.
        max_delay: Cap on how long a path that keeps changing is held, and on how long
            others (``after``, group mates) wait for a path held open or still growing.
        max_hold: Cap on how long a path held open for writing, or still growing, is held
            before it is handed over anyway (with a WARNING naming the file and the writer);
            never less than the consumer's ``max_delay``.
        shutdown_grace: Seconds in-flight batches get to finish on shutdown.
        inotify: Use inotify (false: rescans only, e.g. on NFS).
        pid_file: Written by ``reloadd run``; read by ``reloadd reload``.
        control_socket: Unix socket for ``reloadd status`` / ``reloadd reload``.
        metrics_listen: ``host:port`` for /metrics, /healthz, /readyz (absent: off).
        ready_max_age: /readyz fails when a path has waited longer than this.
        consumers: The consumers, in file order.
        source: The file this came from, for messages.
    """

    state_dir: Path | None
    rescan_interval: float = 15.0
    full_rescan_interval: float = 60.0
    quiet: float = 0.05
    max_delay: float = 5.0
    max_hold: float = 60.0
    shutdown_grace: float = 10.0
    inotify: bool = True
    pid_file: Path | None = None
    control_socket: Path | None = None
    metrics_listen: str | None = None
    ready_max_age: float = 600.0
    consumers: tuple[ConsumerConfig, ...] = ()
    source: Path | None = None

    @property
    def full_rescan_every(self) -> int:
        """Periodic rescans over which every covered file is stat-ed once (1: every rescan stats every file)."""
        if self.rescan_interval <= 0:
            return 1
        return max(1, math.floor(self.full_rescan_interval / self.rescan_interval + 1e-9))  # never longer apart


def load_config(path: str | Path) -> Config:
    """Read and validate a configuration file.

    Raises:
        ConfigError: naming the file, the key and what was expected.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"Failed to read config {path}: {exc.strerror or exc}") from exc
    import tomllib  # 0.6 MiB of modules: only when a file is read (an embedded Reloader is given a dict)

    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    return parse_config(doc, source=path)


def parse_config(doc: dict[str, Any], source: Path | None = None) -> Config:
    """Validate a parsed TOML document.

    Relative paths resolve against the file's directory; every path is normalised
    lexically (``a/../b`` becomes ``b``), so the same folder always has one spelling.
    """
    name = str(source) if source else "<config>"
    base = source.parent.resolve() if source else Path.cwd()
    top = Options(doc, where=name)
    g = Options(top.table("reloadd"), where=f"{name} [reloadd]")
    raw_consumers = top._get("consumer", (list,), [], False)
    top.finish()

    def p(key: str, default: str | None = None) -> Path | None:
        value = g.path(key, default, base=base)
        return Path(value) if value is not None else None

    state_dir = None if g.str("state_dir", "/var/lib/reloadd") == "" else p("state_dir", "/var/lib/reloadd")
    quiet = g.duration("quiet", 0.05, maximum=MAX_QUIET)
    max_delay = g.duration("max_delay", 5.0)
    max_hold = g.duration("max_hold", 60.0)
    rescan_interval = g.duration("rescan_interval", 15.0)
    if 0 < rescan_interval < MIN_RESCAN_INTERVAL:
        raise ConfigError(f"{name} [reloadd]: key 'rescan_interval' must be 0 (off) or at least "
                          f"{MIN_RESCAN_INTERVAL * 1000:g}ms, got {rescan_interval:g}s")
    cfg_kw: dict[str, Any] = dict(
        state_dir=state_dir,
        rescan_interval=rescan_interval,
        full_rescan_interval=g.duration("full_rescan_interval", 60.0),
        quiet=quiet,
        max_delay=max_delay,
        max_hold=max_hold,
        shutdown_grace=g.duration("shutdown_grace", 10.0),
        inotify=g.bool("inotify", True),
        pid_file=p("pid_file"),
        control_socket=p("control_socket"),
        metrics_listen=g.str("metrics_listen"),
        ready_max_age=g.duration("ready_max_age", 600.0, minimum=MIN_READY_MAX_AGE),
    )
    g.finish()
    _check_timing(f"{name} [reloadd]", quiet, max_delay)

    consumers: list[ConsumerConfig] = []
    seen: set[str] = set()
    for i, table in enumerate(raw_consumers):
        consumers.append(_consumer(table, f"{name} [[consumer]] #{i + 1}", base))
        cc = consumers[-1]
        if cc.name in seen:
            raise ConfigError(f"{name}: consumer name {cc.name!r} is used twice")
        seen.add(cc.name)
        if cc.quiet is not None or cc.max_delay is not None:  # the pair the aggregator will use
            _check_timing(f"{name} [[consumer]] #{i + 1} ({cc.name!r})",
                          quiet if cc.quiet is None else cc.quiet,
                          max_delay if cc.max_delay is None else cc.max_delay)
    check_after({cc.name: cc.after for cc in consumers}, name)
    return Config(consumers=tuple(consumers), source=source, **cfg_kw)


def _consumer(table: Any, where: str, base: Path) -> ConsumerConfig:
    c = Options(table, where=where)
    cname = c.str("name", required=True)
    where = f"{where} ({cname!r})"
    c.where = where
    plugin = c.str("plugin", required=True)
    paths = tuple(_abs(Path(x).expanduser(), base) for x in c.str_list("paths"))
    conc = c.int("concurrency", None, minimum=1, maximum=MAX_CONCURRENCY)
    cc = ConsumerConfig(
        name=cname,
        plugin=plugin,
        paths=paths,
        include=tuple(c.str_list("include")),
        exclude=tuple(c.str_list("exclude")),
        recursive=c.bool("recursive", True),
        ignore_defaults=c.bool("ignore_defaults", True),
        quiet=c.duration("quiet", maximum=MAX_QUIET),
        max_delay=c.duration("max_delay"),
        max_hold=c.duration("max_hold"),
        concurrency=conc,
        after=tuple(c.str_list("after")),
        group=_groups(c, paths),
        drift=DriftMode(c.choice("drift", [m.value for m in DriftMode], DriftMode.CORRECT.value)),
        options=c.table("options"),
    )
    c.finish()
    return cc


def _groups(c: Options, paths: tuple[Path, ...]) -> tuple[tuple[str, ...], ...]:
    """``group``: a list whose entries are a glob or a list of globs (one group each).

    Globs match a path relative to its root (or a file name). An absolute glob under one of
    ``paths`` is made relative to it; one under none of them could never match and is refused.
    """
    raw = c._get("group", (list,), [], False)
    out: list[tuple[str, ...]] = []
    for i, entry in enumerate(raw):
        globs = [entry] if isinstance(entry, str) else entry
        if not isinstance(globs, list) or not globs or not all(isinstance(g, str) and g for g in globs):
            raise ConfigError(f"{c.where}: key 'group'[{i}] must be a glob or a non-empty list of globs, "
                              f"got {entry!r}")
        out.append(tuple(_relative_glob(c.where, i, g, paths) for g in globs))
    return tuple(out)


def _relative_glob(where: str, i: int, glob: str, paths: tuple[Path, ...]) -> str:
    if not glob.startswith("/") or not paths:
        return glob  # relative; or the plugin derives its roots: matched against the whole path too
    for root in sorted(paths, key=lambda r: len(r.parts), reverse=True):
        prefix = str(root).rstrip("/") + "/"
        if glob.startswith(prefix) and len(glob) > len(prefix):
            return glob[len(prefix):]
    raise ConfigError(f"{where}: key 'group'[{i}]: {glob!r} is under none of the consumer's paths "
                      f"({', '.join(map(str, paths))}), so it could never match; write it relative to its root")


def _check_timing(where: str, quiet: float, max_delay: float) -> None:
    if max_delay < quiet:
        raise ConfigError(f"{where}: max_delay ({max_delay:g}s) must not be less than quiet ({quiet:g}s)")


def _abs(p: Path, base: Path) -> Path:
    return Path(os.path.normpath(p if p.is_absolute() else base / p))
