"""/metrics is written by reloadd itself (the daemon does not load prometheus_client): what it writes must
read back through prometheus_client's own parsers, whatever a label value holds."""

from __future__ import annotations

import math
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from reloadd._ops._metrics import Family, negotiate, process_families, render

_values = st.floats(allow_nan=True, allow_infinity=True, width=64) | st.integers(0, 2**53)
_label = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)


def _families(consumer: str, kind: str, value: float) -> list[Family]:
    return [
        Family("reloadd_build", "info", "build information.", ("version", "python")).add((consumer, "3.11"), 1),
        Family("reloadd_events", "counter", "Source events \\ with a \"quote\"\nand a line.",
               ("source", "kind")).add((consumer, kind), abs(value) if not math.isnan(value) else 0.0),
        Family("reloadd_consumer_queue_depth", "gauge", "Paths waiting.", ("consumer",)).add((consumer,), value),
        Family("reloadd_rescan_duration_seconds", "summary", "Rescans.").add(("count",), 3).add(("sum",), 0.25),
        Family("reloadd_ready", "gauge", "ready").add((), 1.0),
    ]


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@settings(max_examples=200, deadline=None)
@given(consumer=_label, kind=_label, value=_values)
def test_text_format_reads_back_through_prometheus_client(consumer: str, kind: str, value: float) -> None:
    value = float(value)
    fams = {f.name: f for f in parse_text(render(_families(consumer, kind, value)).decode())}
    assert fams["reloadd_build_info"].type == "gauge"  # how the 0.0.4 format carries an info metric
    [build] = fams["reloadd_build_info"].samples
    assert build.labels == {"version": consumer, "python": "3.11"} and build.value == 1
    [events] = fams["reloadd_events"].samples
    assert fams["reloadd_events"].type == "counter"
    assert fams["reloadd_events"].documentation == "Source events \\ with a \"quote\"\nand a line."
    assert events.name == "reloadd_events_total" and events.labels == {"source": consumer, "kind": kind}
    [depth] = fams["reloadd_consumer_queue_depth"].samples
    assert depth.labels == {"consumer": consumer} and _same(depth.value, value)
    summary = {s.name: s.value for s in fams["reloadd_rescan_duration_seconds"].samples}
    assert summary == {"reloadd_rescan_duration_seconds_count": 3, "reloadd_rescan_duration_seconds_sum": 0.25}


@settings(max_examples=200, deadline=None)
@given(consumer=_label, kind=_label, value=_values)
def test_openmetrics_reads_back_through_prometheus_client(consumer: str, kind: str, value: float) -> None:
    value = float(value)
    text = render(_families(consumer, kind, value), openmetrics=True).decode()
    assert text.endswith("# EOF\n")
    fams = {f.name: f for f in parse_openmetrics(text)}
    assert fams["reloadd_build"].type == "info"
    assert fams["reloadd_build"].samples[0].labels == {"version": consumer, "python": "3.11"}
    [events] = fams["reloadd_events"].samples
    assert events.name == "reloadd_events_total" and events.labels == {"source": consumer, "kind": kind}
    assert _same(fams["reloadd_consumer_queue_depth"].samples[0].value, value)


def test_process_metrics_are_this_process() -> None:
    fams = {f.name: f for f in parse_text(render(process_families()).decode())}
    rss = fams["process_resident_memory_bytes"].samples[0].value
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    assert abs(rss - kib * 1024) < 16 << 20
    assert fams["process_open_fds"].samples[0].value >= 3
    assert fams["process_cpu_seconds"].samples[0].value > 0
    assert fams["process_start_time_seconds"].samples[0].value > 1.6e9


def test_openmetrics_only_when_asked() -> None:
    assert negotiate("application/openmetrics-text; version=1.0.0,text/plain;q=0.5")[0] is True
    assert negotiate("text/plain")[0] is False
    assert negotiate("")[0] is False


def test_the_daemon_loads_neither_aiohttp_nor_prometheus_client() -> None:
    """What `reloadd run` imports with the three built-in consumers and the HTTP listener (~14 MiB less than
    with aiohttp and prometheus_client, on every node)."""
    code = (
        "import sys, importlib.metadata as m\n"
        "import reloadd.cli, reloadd._ops._services, reloadd._ops._webserver, reloadd._reloader\n"
        "for ep in m.entry_points(group='reloadd.consumers'):\n"
        "    ep.load()\n"
        "import reloadd_kube_manifests._client, reloadd_kube_manifests._watch, reloadd_kube_manifests._lease\n"
        "print(' '.join(sorted({n.split('.')[0] for n in sys.modules} & {'aiohttp', 'prometheus_client'})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "", out.stdout
