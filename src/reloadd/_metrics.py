"""Prometheus metrics read from a pipeline's snapshot (:mod:`reloadd._snapshot`) at scrape time.

Nothing is counted twice: the engine, the aggregator and each work queue already keep
their counters (``EngineStats``, ``Aggregator.coalesced``, ``QueueStats``); the collector
turns them into metric families at scrape time. Each reloader gets its own
:class:`~prometheus_client.CollectorRegistry`, so two reloaders embedded in one process
(or a host application with its own default registry) never clash.

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
consumer_info                                  gauge    consumer, plugin
consumer_batches_total                         counter  consumer
consumer_results_total                         counter  consumer, outcome=success|retry|failure
consumer_changes_unchanged_total               counter  consumer (dropped: content unchanged)
consumer_queue_depth, consumer_in_flight       gauge    consumer
consumer_failing_paths, consumer_rejected_paths gauge   consumer
consumer_oldest_pending_age_seconds            gauge    consumer
consumer_last_success_timestamp_seconds        gauge    consumer (0: never)
consumer_stat                                  gauge    consumer, name (the plugin's ``stats``)
=============================================  =======  ====================================

``outcome="failure"`` counts permanent failures (:class:`~reloadd.Reject`);
``outcome="retry"`` counts transient ones (:class:`~reloadd.Retry`, or ``handle`` raising).
"""

from __future__ import annotations

import importlib.metadata
import platform
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from ._snapshot import EngineCounters, Pipeline, Snapshot
from ._watch import WatchState

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__ = ["ReloaderCollector", "build_registry"]


def _version() -> str:
    try:
        return importlib.metadata.version("reloadd")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class ReloaderCollector(Collector):
    """A collector that reads a pipeline's snapshot at scrape time.

    Args:
        pipeline: The pipeline (a :class:`~reloadd.Reloader`; before it started only build info,
            the watch gauges and ``reloadd_ready 0`` are exported).
        loop_lag: Returns the event loop's last measured lag in seconds.
    """

    def __init__(self, pipeline: Pipeline, *, loop_lag: Callable[[], float | None] | None = None) -> None:
        self.pipeline = pipeline
        self._loop_lag = loop_lag
        self._version = _version()

    def collect(self) -> Iterator[Metric]:
        """Yield every family (called by the registry on each scrape)."""
        info = InfoMetricFamily("reloadd_build", "reloadd build information.")
        info.add_metric([], {"version": self._version, "python": platform.python_version()})
        yield info
        snap = self.pipeline.snapshot()
        state = snap.watch.state
        yield _gauge("reloadd_ready", "1 while ready (as /readyz answers).", float(snap.ready))
        yield _gauge("reloadd_watch_armed", "1 while every inotify watch is armed.", float(state is WatchState.ARMED))
        yield _gauge("reloadd_watch_degraded", "1 while watching by periodic rescans only.",
                     float(state is WatchState.DEGRADED))
        if self._loop_lag is not None:
            lag = self._loop_lag()
            if lag is not None:
                yield _gauge("reloadd_event_loop_lag_seconds", "Last measured event loop lag.", lag)
        if snap.engine is None:
            return
        yield _gauge("reloadd_watches", "inotify watches held.", float(snap.watch_count))
        yield from self._engine_families(snap.engine)
        yield from self._consumer_families(snap)

    def _engine_families(self, st: EngineCounters) -> Iterator[Metric]:
        events = CounterMetricFamily("reloadd_events", "Source events received.", labels=["source", "kind"])
        for (source, kind), n in sorted(st.events.items()):
            events.add_metric([source, kind], n)
        yield events
        yield CounterMetricFamily("reloadd_changes_coalesced",
                                  "Events folded into a path already waiting to settle.", value=st.coalesced)
        yield CounterMetricFamily("reloadd_changes_handed_over",
                                  "Settled paths put on a consumer's queue.", value=st.handed_over)
        yield CounterMetricFamily("reloadd_overflows", "inotify queue overflows (each forces a rescan).",
                                  value=st.overflows)
        yield CounterMetricFamily("reloadd_resyncs", "Forced resyncs (SIGHUP, reloadd reload).",
                                  value=st.resyncs)
        yield SummaryMetricFamily("reloadd_rescan_duration_seconds", "Rescans (stat walks) of every root.",
                                  count_value=st.rescans, sum_value=st.rescan_seconds)
        yield CounterMetricFamily("reloadd_rescans_covered",
                                  "Periodic rescans that listed the directories live watches cover, "
                                  "without a stat per file (see full_rescan_interval).", value=st.covered_rescans)

    def _consumer_families(self, snap: Snapshot) -> Iterator[Metric]:
        lab = ["consumer"]
        fam: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "info": GaugeMetricFamily("reloadd_consumer_info", "Configured consumers.",
                                      labels=["consumer", "plugin"]),
            "batches": CounterMetricFamily("reloadd_consumer_batches", "Batches handed to the consumer.",
                                           labels=lab),
            "results": CounterMetricFamily("reloadd_consumer_results", "Per-path results by outcome.",
                                           labels=["consumer", "outcome"]),
            "unchanged": CounterMetricFamily(
                "reloadd_consumer_changes_unchanged", "Changes dropped because the content was unchanged.",
                labels=lab),
            "depth": GaugeMetricFamily("reloadd_consumer_queue_depth",
                                       "Paths waiting, including those in retry backoff.", labels=lab),
            "inflight": GaugeMetricFamily("reloadd_consumer_in_flight", "Paths being handled.", labels=lab),
            "failing": GaugeMetricFamily("reloadd_consumer_failing_paths",
                                         "Paths waiting for a retry after a transient failure.", labels=lab),
            "rejected": GaugeMetricFamily("reloadd_consumer_rejected_paths",
                                          "Paths whose last result was a permanent failure.", labels=lab),
            "age": GaugeMetricFamily("reloadd_consumer_oldest_pending_age_seconds",
                                     "Seconds the oldest waiting path has waited.", labels=lab),
            "last": GaugeMetricFamily("reloadd_consumer_last_success_timestamp_seconds",
                                      "Unix time of the last acknowledged path (0: never).", labels=lab),
            "stat": GaugeMetricFamily("reloadd_consumer_stat", "Plugin-specific counters and gauges.",
                                      labels=["consumer", "name"]),
            "prune": GaugeMetricFamily(
                "reloadd_prune_held", "What held removals would remove (prune safety): objects, images or "
                "files, as the consumer counts them; run `reloadd reload --confirm-prune` or bring the input back.",
                labels=lab),
            "prune_paths": GaugeMetricFamily("reloadd_prune_held_paths", "Paths whose removal is held.", labels=lab),
            "leader": GaugeMetricFamily(
                "reloadd_leader", "1 while the consumer may act: it holds its Lease (leader_elect) or needs none; "
                "0 while it stands by.",
                labels=lab),
            "drift": CounterMetricFamily(
                "reloadd_drift", "Drift events the consumer's far-side sources saw (images removed, objects "
                "edited, hosts.toml rewritten), per kind.", labels=["consumer", "kind"]),
            "drifted": GaugeMetricFamily(
                "reloadd_drifted_paths", "Files whose declared state has drifted and is not restored "
                "(detect mode, or a fight being backed off).", labels=lab),
            "held": GaugeMetricFamily(
                "reloadd_consumer_held_paths", "Paths settling for longer than max_delay (open for writing, still "
                "growing): nothing waits for them any more; handed over at max_hold.", labels=lab),
        }
        for c in sorted(snap.consumers, key=lambda c: c.name):
            name = c.name
            fam["info"].add_metric([name, c.plugin], 1)
            fam["batches"].add_metric([name], c.batches)
            for outcome, n in (("success", c.acked), ("retry", c.retried), ("failure", c.rejected_total)):
                fam["results"].add_metric([name, outcome], n)
            fam["unchanged"].add_metric([name], c.dropped_unchanged)
            fam["depth"].add_metric([name], c.pending)
            fam["inflight"].add_metric([name], c.in_flight)
            fam["failing"].add_metric([name], c.failing)
            fam["rejected"].add_metric([name], c.rejected)
            fam["age"].add_metric([name], c.oldest_pending_age)
            fam["last"].add_metric([name], c.last_success or 0.0)
            fam["prune"].add_metric([name], c.prune_held)
            fam["prune_paths"].add_metric([name], c.prune_held_paths)
            fam["held"].add_metric([name], c.held_paths)
            fam["drifted"].add_metric([name], c.drifted)
            fam["leader"].add_metric([name], c.stats.get("leader", 1.0))
            for kind, n in sorted(c.drift_total.items()):
                fam["drift"].add_metric([name, kind], n)
            for key, value in sorted(c.stats.items()):
                fam["stat"].add_metric([name, key], value)
        yield from fam.values()


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def build_registry(
    pipeline: Pipeline,
    *,
    loop_lag: Callable[[], float | None] | None = None,
    process: bool = True,
) -> CollectorRegistry:
    """A private registry holding a :class:`ReloaderCollector` (and process metrics).

    Args:
        pipeline: The pipeline to export (a :class:`~reloadd.Reloader`).
        loop_lag: Returns the last measured event loop lag (seconds).
        process: Also export ``process_*`` (CPU, memory, open fds) of this process.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReloaderCollector(pipeline, loop_lag=loop_lag))
    if process:
        ProcessCollector(registry=registry)
    return registry

