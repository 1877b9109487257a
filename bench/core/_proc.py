"""Parent-side helpers: watcher subprocesses, /proc readings and summary statistics."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]
_TICK = os.sysconf("SC_CLK_TCK")


# Statistics --------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(values: Sequence[float]) -> dict[str, float]:
    """n, p50, p90, p99, max and mean of ``values``."""
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values) if values else math.nan,
        "mean": sum(values) / len(values) if values else math.nan,
    }


def ratio(a: float, b: float) -> float:
    """``a / b``, NaN when undefined."""
    if b == 0 or math.isnan(a) or math.isnan(b):
        return math.nan
    return a / b


# /proc -------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all threads, live and exited), in seconds."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    rest = raw[raw.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / _TICK


def context_switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches summed over the live threads.

    A voluntary switch is a thread blocking (then being woken): the cheap wakeup count.
    ``/proc/<pid>/status`` alone shows the main thread only, hence the sum over tasks.
    """
    vol = invol = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "status").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                vol += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                invol += int(line.split()[1])
    return vol, invol


def memory_kib(pid: int) -> dict[str, int]:
    """VmHWM (peak RSS) and VmRSS of ``pid`` in KiB, plus its thread count."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS", "Threads"):
            out[key] = int(value.split()[0])
    return out


# Watcher subprocesses ----------------------------------------------------------------
@dataclass
class Delivery:
    """One batch as a watcher reported it."""

    t: float
    names: list[str]


@dataclass
class Watcher:
    """A watcher child process (see :mod:`bench.core._child`) and what it reported so far."""

    label: str
    kind: str
    proc: subprocess.Popen[str]
    batches: list[Delivery] = field(default_factory=list)
    first_seen: dict[str, float] = field(default_factory=dict)
    stats: dict[str, Any] | None = None
    pid: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)

    @classmethod
    def start(cls, label: str, kind: str, root: Path, log: Path, *args: str) -> Watcher:
        """Spawn ``python -m bench.core._child KIND ROOT ARGS`` and wait for its ready line."""
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        err: IO[str] = open(log, "a")
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.core._child", kind, str(root), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO, env=env,
        )
        err.close()
        w = cls(label, kind, proc)
        threading.Thread(target=w._read, name=f"bench-read-{label}", daemon=True).start()
        if not w.wait(lambda: w.pid != 0, 600):
            w.stop()
            raise RuntimeError(f"{label} did not start (see {log})")
        return w

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            obj = json.loads(line)
            with self.cond:
                if obj["ev"] == "batch":
                    d = Delivery(obj["t"], obj["names"])
                    self.batches.append(d)
                    for n in d.names:
                        self.first_seen.setdefault(n, d.t)
                elif obj["ev"] == "ready":
                    self.pid = obj["pid"]
                elif obj["ev"] == "stats":
                    self.stats = obj
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait(self, pred: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``pred()`` (evaluated under the lock) holds; False on timeout or exit."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    return pred()
                self.cond.wait(min(left, 0.5))
            return True

    def wait_seen(self, name: str, timeout: float) -> bool:
        """Wait until some batch named ``name``."""
        return self.wait(lambda: name in self.first_seen, timeout)

    def first_batch_with(self, name: str, after: float, start: int = 0) -> tuple[int, Delivery] | None:
        """The first batch at index >= ``start`` stamped at or after ``after`` that names ``name``."""
        with self.cond:
            for i in range(start, len(self.batches)):
                b = self.batches[i]
                if b.t >= after and name in b.names:
                    return i, b
        return None

    def ask_stats(self, timeout: float = 10.0) -> dict[str, Any] | None:
        """Ask a reloadd child for its engine counters (a floor child: its overflows)."""
        if self.kind not in ("reloadd", "floor") or self.proc.stdin is None:
            return None
        with self.cond:
            self.stats = None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        self.wait(lambda: self.stats is not None, timeout)
        return self.stats

    def stop(self) -> None:
        """Terminate the child (SIGTERM, then SIGKILL after 5 s)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for s in (self.proc.stdin, self.proc.stdout):
            if s is not None:
                s.close()


def write_file(path: Path, payload: bytes) -> float:
    """Write ``payload`` to ``path`` (truncate, write, close); return CLOCK_MONOTONIC after close."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, payload)
    finally:
        os.close(fd)
    return time.monotonic()


def probe_ready(root: Path, watchers: Sequence[Watcher], timeout: float = 60.0) -> None:
    """Write a probe file until every watcher reported it (watchfiles arms asynchronously)."""
    name = "ready-probe"
    deadline = time.monotonic() + timeout
    n = 0
    while time.monotonic() < deadline:
        n += 1
        write_file(root / name, f"probe {n}\n".encode())
        if all(w.wait_seen(name, 0.5) for w in watchers):
            return
    raise RuntimeError(f"watchers {[w.label for w in watchers if name not in w.first_seen]} never reported")
