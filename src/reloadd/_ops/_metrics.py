"""Prometheus metrics read from a pipeline's snapshot (:mod:`reloadd._snapshot`) at scrape time.

Nothing is counted twice: the engine, the aggregator and each work queue already keep
their counters (``EngineStats``, ``Aggregator.coalesced``, ``QueueStats``); the collector
turns them into metric families at scrape time, and :func:`render` writes them in the
Prometheus text format (0.0.4). The daemon does not import ``prometheus_client`` (~4 MiB on
every node); :func:`build_registry` wraps the same families in a private
:class:`~prometheus_client.CollectorRegistry` for an application that embeds a reloader and
exports through its own ``prometheus_client`` stack (imported only then).

Exported families (all prefixed ``reloadd_``):

=============================================  =======  ====================================
name                                           type     labels
=============================================  =======  ====================================
build_info                                     gauge    version, python
ready, watch_armed, watch_degraded             gauge    (ready: as /readyz answers)
watches                                        gauge    (inotify watches held)
event_loop_lag_seconds                         gauge    (when the HTTP listener runs)
events_total                                   counter  source, kind (inotify: one per path per read)
changes_coalesced_total                        counter  (events folded into a pending path)
changes_handed_over_total                      counter  (settled paths put on a queue)
overflows_total, resyncs_total                 counter
rescan_duration_seconds                        summary  (count = rescans of every root)
rescans_covered_total                          counter  (those that took live watches on trust)
rescans_waited_total                           counter  (periodic ones that waited for a burst to settle)
overflow_rescan_delay_seconds                  gauge    (last overflow to the start of its rescan)
consumer_info                                  gauge    consumer, plugin
consumer_batches_total                         counter  consumer
consumer_results_total                         counter  consumer, outcome=success|retry|failure
consumer_changes_unchanged_total               counter  consumer (dropped: content unchanged)
consumer_queue_depth, consumer_in_flight       gauge    consumer
consumer_failing_paths, consumer_rejected_paths gauge   consumer
consumer_oldest_pending_age_seconds            gauge    consumer
consumer_last_success_timestamp_seconds        gauge    consumer (0: never)
consumer_stat                                  gauge    consumer, name (the plugin's ``stats``)
<metric> (a stat ``metric{label=v}``)          counter  consumer, label (``..._total``; else a gauge)
objects                                        gauge    consumer, health (``HealthReporting`` consumers)
health_current_seconds                         histogram consumer (a file's save to all its objects current)
=============================================  =======  ====================================

``outcome="failure"`` counts permanent failures (:class:`~reloadd.Reject`);
``outcome="retry"`` counts transient ones (:class:`~reloadd.Retry`, or ``handle`` raising).
"""

from __future__ import annotations

import functools
import math
import os
import platform
import re
import resource
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._snapshot import ConsumerSnapshot, EngineCounters, Pipeline, Snapshot
from .._watch import WatchState

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = [
    "CONTENT_TYPE",
    "OPENMETRICS_TYPE",
    "Family",
    "ReloaderCollector",
    "build_registry",
    "negotiate",
    "process_families",
    "render",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""What :func:`render` writes by default."""
OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
"""What :func:`render` writes with ``openmetrics=True``."""


@dataclass
class Family:
    """One metric family: its samples are ``(label values, value)``.

    ``kind`` is ``counter`` (exported as ``<name>_total``), ``gauge``, ``info`` (exported as
    ``<name>_info``, value 1, the labels being the information) or ``summary`` (``<name>_count`` and
    ``<name>_sum``, given as two samples labelled ``("count",)`` and ``("sum",)``) or ``histogram`` (each sample's
    label values are ``labels`` followed by ``"bucket"`` and its bound as text (``"+Inf"`` last), ``"sum"`` or
    ``"count"``: see :meth:`add_histogram`).
    """

    name: str
    kind: str
    doc: str
    labels: Sequence[str] = ()
    samples: list[tuple[Sequence[str], float]] = field(default_factory=list)

    def add(self, values: Sequence[str], value: float) -> Family:
        """Add one sample; returns the family."""
        self.samples.append((values, value))
        return self

    def add_histogram(self, values: Sequence[str], bounds: Sequence[float], counts: Sequence[int], total: float,
                      count: int) -> Family:
        """Add one cumulative histogram (``counts[i]`` observations ≤ ``bounds[i]``); returns the family."""
        for bound, n in zip(bounds, counts, strict=True):
            self.samples.append(((*values, "bucket", _number(float(bound))), n))
        self.samples.append(((*values, "bucket", "+Inf"), count))
        self.samples.append(((*values, "sum"), total))
        self.samples.append(((*values, "count"), count))
        return self


def _counter(name: str, doc: str, value: float) -> Family:
    return Family(name, "counter", doc).add((), value)


def _version() -> str:
    import importlib.metadata  # 2.7 MiB of modules: only when metrics are served

    try:
        return importlib.metadata.version("reloadd")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class ReloaderCollector:
    """Reads a pipeline's snapshot at scrape time into :class:`Family` objects.

    Args:
        pipeline: The pipeline (a :class:`~reloadd.Reloader`; before it started only build info,
            the watch gauges and ``reloadd_ready 0`` are exported).
        loop_lag: Returns the event loop's last measured lag in seconds.
    """

    def __init__(self, pipeline: Pipeline, *, loop_lag: Callable[[], float | None] | None = None) -> None:
        self.pipeline = pipeline
        self.loop_lag = loop_lag
        self._version = _version()

    def collect(self) -> Iterator[Family]:
        """Yield every family (called by the registry on each scrape)."""
        yield Family("reloadd_build", "info", "reloadd build information.", ("version", "python")).add(
            (self._version, platform.python_version()), 1)
        snap = self.pipeline.snapshot()
        state = snap.watch.state
        yield _gauge("reloadd_ready", "1 while ready (as /readyz answers).", float(snap.ready))
        yield _gauge("reloadd_watch_armed", "1 while every inotify watch is armed.", float(state is WatchState.ARMED))
        yield _gauge("reloadd_watch_degraded", "1 while watching by periodic rescans only.",
                     float(state is WatchState.DEGRADED))
        if self.loop_lag is not None:
            lag = self.loop_lag()
            if lag is not None:
                yield _gauge("reloadd_event_loop_lag_seconds", "Last measured event loop lag.", lag)
        if snap.engine is None:
            return
        yield _gauge("reloadd_watches", "inotify watches held.", float(snap.watch_count))
        yield from self._engine_families(snap.engine)
        yield from self._consumer_families(snap)

    def _engine_families(self, st: EngineCounters) -> Iterator[Family]:
        events = Family("reloadd_events", "counter", "Source events received.", ("source", "kind"))
        for (source, kind), n in sorted(st.events.items()):
            events.add((source, kind), n)
        yield events
        yield _counter("reloadd_changes_coalesced", "Events folded into a path already waiting to settle.",
                       st.coalesced)
        yield _counter("reloadd_changes_handed_over", "Settled paths put on a consumer's queue.", st.handed_over)
        yield _counter("reloadd_overflows", "inotify queue overflows (each forces a rescan).", st.overflows)
        yield _counter("reloadd_resyncs", "Forced resyncs (SIGHUP, reloadd reload).", st.resyncs)
        yield Family("reloadd_rescan_duration_seconds", "summary", "Rescans (stat walks) of every root.").add(
            ("count",), st.rescans).add(("sum",), st.rescan_seconds)
        if st.recovery_delay is not None:
            yield _gauge("reloadd_overflow_rescan_delay_seconds",
                         "Seconds from the last loss of events (inotify overflow) to the start of its rescan.",
                         st.recovery_delay)
        yield _counter("reloadd_rescans_covered",
                       "Periodic rescans that listed the directories live watches cover, "
                       "without a stat per file (see full_rescan_interval).", st.covered_rescans)
        yield _counter("reloadd_rescans_waited",
                       "Periodic rescans that fell due while paths were settling and waited for them to be "
                       "handed over (one rescan_interval at most).", st.rescans_waited)

    def _consumer_families(self, snap: Snapshot) -> Iterator[Family]:
        fam = _consumer_family_table()
        for c in sorted(snap.consumers, key=lambda c: c.name):
            _add_consumer(fam, c)
        yield from fam.values()

_LABELLED_STAT = re.compile(r"^([a-z][a-z0-9_]*)\{([a-z][a-z0-9_]*)=([^}]*)\}$")
"""A plugin stat named ``metric{label=value}`` is exported as its own family ``reloadd_<metric>{consumer,label}``
(a counter when the name ends in ``_total``), not under ``reloadd_consumer_stat``: e.g. containerd-images'
``images_refused_total{reason=bad_signature}`` is ``reloadd_images_refused_total{consumer,reason}``."""


def _consumer_family_table() -> dict[str, Family]:
    """The per-consumer families, empty, by key (``own:<metric>`` keys are added for plugins' labelled stats)."""
    lab = ("consumer",)
    gauge, counter = "gauge", "counter"
    return {
        "info": Family("reloadd_consumer_info", gauge, "Configured consumers.", ("consumer", "plugin")),
        "batches": Family("reloadd_consumer_batches", counter, "Batches handed to the consumer.", lab),
        "results": Family("reloadd_consumer_results", counter, "Per-path results by outcome.",
                          ("consumer", "outcome")),
        "unchanged": Family("reloadd_consumer_changes_unchanged", counter,
                            "Changes dropped because the content was unchanged.", lab),
        "depth": Family("reloadd_consumer_queue_depth", gauge,
                        "Paths waiting, including those in retry backoff.", lab),
        "inflight": Family("reloadd_consumer_in_flight", gauge, "Paths being handled.", lab),
        "failing": Family("reloadd_consumer_failing_paths", gauge,
                          "Paths waiting for a retry after a transient failure.", lab),
        "rejected": Family("reloadd_consumer_rejected_paths", gauge,
                           "Paths whose last result was a permanent failure.", lab),
        "age": Family("reloadd_consumer_oldest_pending_age_seconds", gauge,
                      "Seconds the oldest waiting path has waited.", lab),
        "last": Family("reloadd_consumer_last_success_timestamp_seconds", gauge,
                       "Unix time of the last acknowledged path (0: never).", lab),
        "stat": Family("reloadd_consumer_stat", gauge, "Plugin-specific counters and gauges.",
                       ("consumer", "name")),
        "prune": Family(
            "reloadd_prune_held", gauge, "What held removals would remove (prune safety): objects, images or "
            "files, as the consumer counts them; run `reloadd reload --confirm-prune` or bring the input back.",
            lab),
        "prune_paths": Family("reloadd_prune_held_paths", gauge, "Paths whose removal is held.", lab),
        "leader": Family(
            "reloadd_leader", gauge, "1 while the consumer may act: it holds its Lease (leader_elect) or needs "
            "none; 0 while it stands by.", lab),
        "drift": Family(
            "reloadd_drift", counter, "Drift events the consumer's far-side sources saw (images removed, "
            "objects edited, hosts.toml rewritten), per kind.", ("consumer", "kind")),
        "drifted": Family(
            "reloadd_drifted_paths", gauge, "Files whose declared state has drifted and is not restored "
            "(detect mode, or a fight being backed off).", lab),
        "werr": Family(
            "reloadd_state_write_errors", counter, "Writes of the consumer's persisted state (records, held "
            "removals) that failed: disk full, read-only, I/O error. It keeps delivering meanwhile.", lab),
        "unpersisted": Family(
            "reloadd_state_unpersisted_seconds", gauge, "Seconds since the consumer's state was last "
            "persisted, while its writes fail (0 while persisted): a restart would hand over again what it "
            "acknowledged since.", lab),
        "aside": Family(
            "reloadd_state_files_set_aside", counter, "State files found unreadable at start and moved aside "
            "(named <file>.broken-<UTC time>); the consumer started from the safest assumption.", lab),
        "objects": Family(
            "reloadd_objects", gauge, "Objects the consumer delivered, by health (current, progressing, failed, "
            "terminating), for consumers that track it (kube-manifests).", ("consumer", "health")),
        "to_current": Family(
            "reloadd_health_current_seconds", "histogram", "Seconds from a file's save to all its objects "
            "being current.", lab),
        "held": Family(
            "reloadd_consumer_held_paths", gauge, "Paths settling for longer than max_delay (open for writing, "
            "still growing): nothing waits for them any more; handed over at max_hold.", lab),
    }


def _add_consumer(fam: dict[str, Family], c: ConsumerSnapshot) -> None:
    """One consumer's samples added to the families of :func:`_consumer_family_table`."""
    name = c.name
    fam["info"].add((name, c.plugin), 1)
    fam["batches"].add((name,), c.batches)
    for outcome, n in (("success", c.acked), ("retry", c.retried), ("failure", c.rejected_total)):
        fam["results"].add((name, outcome), n)
    fam["unchanged"].add((name,), c.dropped_unchanged)
    fam["depth"].add((name,), c.pending)
    fam["inflight"].add((name,), c.in_flight)
    fam["failing"].add((name,), c.failing)
    fam["rejected"].add((name,), c.rejected)
    fam["age"].add((name,), c.oldest_pending_age)
    fam["last"].add((name,), c.last_success or 0.0)
    fam["prune"].add((name,), c.prune_held)
    fam["prune_paths"].add((name,), c.prune_held_paths)
    fam["held"].add((name,), c.held_paths)
    fam["drifted"].add((name,), c.drifted)
    fam["werr"].add((name,), c.state_write_errors)
    fam["unpersisted"].add((name,), c.state_unpersisted_seconds)
    fam["aside"].add((name,), c.state_set_aside)
    fam["leader"].add((name,), c.stats.get("leader", 1.0))
    for kind, n in sorted(c.drift_total.items()):
        fam["drift"].add((name, kind), n)
    if c.health is not None:
        for health, n in sorted(c.health.objects.items()):
            fam["objects"].add((name, health), n)
        h = c.health.to_current
        fam["to_current"].add_histogram((name,), h.bounds, h.counts, h.total, h.count)
    _add_stats(fam, name, c.stats)


def _add_stats(fam: dict[str, Family], name: str, stats: Mapping[str, float]) -> None:
    """A consumer's own stats: ``metric{label=value}`` in a family of its own (see :data:`_LABELLED_STAT`), the
    others under ``reloadd_consumer_stat``."""
    for key, value in sorted(stats.items()):
        if (m := _LABELLED_STAT.match(key)) is not None:
            metric, label, label_value = m.groups()
            own = fam.get(f"own:{metric}")
            if own is None:
                total = metric.endswith("_total")  # a counter family is exported as <name>_total
                own = fam[f"own:{metric}"] = Family(
                    f"reloadd_{metric.removesuffix('_total')}", "counter" if total else "gauge",
                    f"A consumer's own {'counter' if total else 'gauge'} (its stat {metric}{{{label}=...}}).",
                    ("consumer", label))
            own.add((name, label_value), value)
            continue
        fam["stat"].add((name, key), value)


def _gauge(name: str, doc: str, value: float) -> Family:
    return Family(name, "gauge", doc).add((), value)


@functools.cache
def _start_time(ticks: int) -> float:
    """When this process started (Unix time): boot time plus its start in clock ticks; read once."""
    with open("/proc/self/stat", "rb") as f:
        started = int(f.read().rpartition(b")")[2].split()[19])
    with open("/proc/stat", "rb") as f:
        boot = next((float(line.split()[1]) for line in f if line.startswith(b"btime ")), 0.0)
    return boot + started / ticks


def process_families() -> Iterator[Family]:
    """``process_*`` of this process (CPU, memory, start time, descriptors), read from ``/proc``."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        ticks = os.sysconf("SC_CLK_TCK")
        page = os.sysconf("SC_PAGE_SIZE")
        fds = len(os.listdir("/proc/self/fd"))
        start = _start_time(ticks)
    except (OSError, ValueError, IndexError):
        return  # not Linux, or /proc not mounted: no process metrics
    times = os.times()
    yield _counter("process_cpu_seconds", "Total user and system CPU time spent in seconds.", times.user + times.system)
    yield _gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", float(fields[20]))
    yield _gauge("process_resident_memory_bytes", "Resident memory size in bytes.", float(int(fields[21]) * page))
    yield _gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", start)
    yield _gauge("process_open_fds", "Number of open file descriptors.", float(fds))
    yield _gauge("process_max_fds", "Maximum number of open file descriptors.",
                 float(resource.getrlimit(resource.RLIMIT_NOFILE)[0]))


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    return "{" + ",".join(f'{n}="{_label_value(str(v))}"' for n, v in zip(names, values, strict=True)) + "}"


def render(families: Iterable[Family], *, openmetrics: bool = False) -> bytes:
    """``families`` in the Prometheus text format 0.0.4 (:data:`CONTENT_TYPE`), or in OpenMetrics 1.0
    (:data:`OPENMETRICS_TYPE`: counters and info named without their suffix in ``# TYPE``, ``# EOF`` last)."""
    out: list[str] = []
    for fam in families:
        sample = fam.name
        if fam.kind == "counter":
            sample = fam.name.removesuffix("_total") + "_total"
        elif fam.kind == "info":
            sample = fam.name + "_info"
        if openmetrics:
            name, kind = sample.removesuffix("_total") if fam.kind == "counter" else fam.name, fam.kind
        else:
            name, kind = sample, "gauge" if fam.kind == "info" else fam.kind
        doc = fam.doc.replace("\\", "\\\\").replace("\n", "\\n")
        if openmetrics:
            doc = doc.replace('"', '\\"')
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        for values, value in fam.samples:
            if fam.kind == "summary":
                out.append(f"{fam.name}_{values[0]} {_number(value)}\n")
            elif fam.kind == "histogram":
                n = len(fam.labels)
                labels = _labels((*fam.labels, "le"), (*values[:n], values[n + 1])) if values[n] == "bucket" else \
                    _labels(fam.labels, values[:n])
                out.append(f"{fam.name}_{values[n]}{labels} {_number(value)}\n")
            elif fam.kind == "info":
                out.append(f"{sample}{_labels(fam.labels, values)} 1.0\n")
            else:
                out.append(f"{sample}{_labels(fam.labels, values)} {_number(value)}\n")
    if openmetrics:
        out.append("# EOF\n")
    return "".join(out).encode()


def negotiate(accept: str) -> tuple[bool, str]:
    """``(openmetrics, content type)`` for a request's ``Accept`` header."""
    if any(part.split(";")[0].strip() == "application/openmetrics-text" for part in accept.split(",")):
        return True, OPENMETRICS_TYPE
    return False, CONTENT_TYPE


def build_registry(
    pipeline: Pipeline,
    *,
    loop_lag: Callable[[], float | None] | None = None,
    process: bool = True,
) -> CollectorRegistry:
    """A private ``prometheus_client`` registry exporting the same families as ``/metrics``.

    For an application that embeds a reloader and exports metrics through its own
    ``prometheus_client`` stack; ``prometheus_client`` is imported here, not by the daemon.

    Args:
        pipeline: The pipeline to export (a :class:`~reloadd.Reloader`).
        loop_lag: Returns the last measured event loop lag (seconds).
        process: Also export ``process_*`` (CPU, memory, open fds) of this process.
    """
    from prometheus_client import CollectorRegistry, ProcessCollector
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        InfoMetricFamily,
        SummaryMetricFamily,
    )

    collector = ReloaderCollector(pipeline, loop_lag=loop_lag)

    def convert(fam: Family) -> Any:
        names = list(fam.labels)
        if fam.kind == "summary":
            values = dict((v[0], x) for v, x in fam.samples)
            return SummaryMetricFamily(fam.name, fam.doc, count_value=int(values.get("count", 0)),
                                       sum_value=values.get("sum", 0.0))
        if fam.kind == "histogram":
            hist = HistogramMetricFamily(fam.name, fam.doc, labels=names)
            n = len(names)
            series: dict[tuple[str, ...], tuple[list[tuple[str, float]], float]] = {}
            for v, x in fam.samples:
                buckets, total = series.setdefault(tuple(v[:n]), ([], 0.0))
                if v[n] == "bucket":
                    buckets.append((v[n + 1], x))
                elif v[n] == "sum":
                    series[tuple(v[:n])] = (buckets, x)
            for key, (buckets, total) in series.items():
                hist.add_metric(list(key), buckets, total)
            return hist
        if fam.kind == "info":
            info = InfoMetricFamily(fam.name, fam.doc)
            for v, _ in fam.samples:
                info.add_metric([], dict(zip(names, v, strict=True)))
            return info
        cls = CounterMetricFamily if fam.kind == "counter" else GaugeMetricFamily
        if not names:
            return cls(fam.name, fam.doc, value=fam.samples[0][1] if fam.samples else 0.0)
        out = cls(fam.name, fam.doc, labels=names)
        for v, x in fam.samples:
            out.add_metric(list(v), x)
        return out

    class _Adapter:
        def collect(self) -> Iterator[Any]:
            return (convert(f) for f in collector.collect())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Adapter())
    if process:
        ProcessCollector(registry=registry)
    return registry
