"""The health of every file: applying, progressing, current or failed, from its objects' kstatus verdicts.

Fed by what the consumer already has, never by polling: the server's answer to each apply (the object as
it stands right after it) and the ``kube-watch`` source's list + watch of every member. An observation
older than the apply answer (a lower ``resourceVersion``: a watch event queued before the apply) is
ignored, so a status written before the latest generation was applied is never taken as the health
(argoproj/argo-cd#4669); kstatus' own generation check covers a controller that has not caught up yet.

A file:

- is ``applying`` while the consumer applies it;
- is ``failed`` the moment one of its objects is (fail-fast, as Flux since 2.1), naming the object, the
  condition reason and its message; or when ``health_timeout`` passes with an object still progressing
  (``HealthTimeout``, naming the first such object);
- is ``current`` once every object is, and ``progressing`` until then.

A failed file may still recover (its Deployment's next rollout succeeds): it becomes current. Transitions
are reported to ``on_change`` (the consumer logs, records an Event, and tells the core).
"""

from __future__ import annotations

import asyncio
import bisect
import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reloadd import FileHealth, HealthReport, Histogram

from ._applyset import ObjRef
from ._kstatus import Health, Verdict, compute

__all__ = ["BUCKETS", "FileState", "HealthBook", "describe"]

BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Bounds (seconds) of the save → current histogram."""


class FileState(enum.Enum):
    """Where a file stands after its last hand-over."""

    APPLYING = "applying"
    """Being applied now."""
    PROGRESSING = "progressing"
    """Applied; some object is not current yet."""
    CURRENT = "current"
    """Every object is current."""
    FAILED = "failed"
    """An object failed, or ``health_timeout`` passed first."""


def describe(ref: ObjRef) -> str:
    """``Deployment web/app`` (``CustomResourceDefinition widgets.example.com``)."""
    return f"{ref.kind} {ref.namespace + '/' if ref.namespace else ''}{ref.name}"


def _rv(obj: Mapping[str, Any]) -> int | None:
    value = (obj.get("metadata") or {}).get("resourceVersion")
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None  # opaque by contract: not comparable, so not compared


@dataclass
class FileHealthState:
    """One file's health (mutable: the book's own)."""

    state: FileState
    since: float
    """Unix time it entered ``state``."""
    saved: float
    """Unix time of the save being applied (the histogram's start)."""
    refs: tuple[ObjRef, ...] = ()
    failure: tuple[str, str, str] = ("", "", "")
    """(object, reason, message) when failed."""
    culprit: ObjRef | None = None
    """The object ``failure`` names, if one does."""
    timer: asyncio.TimerHandle | None = None
    wave: int | None = None
    observed: bool = False
    """Whether it reached current since its last apply (observed once in the histogram)."""


@dataclass
class _Seen:
    rv: int | None
    verdict: Verdict
    floor: int | None = None
    """The resourceVersion of the last apply answer: observations older are stale."""


@dataclass
class HealthBook:
    """Object verdicts and file states of one consumer.

    Args:
        timeout: ``health_timeout`` in seconds.
        on_change: Called with (path, old state, the file) on every change of a file's state.
    """

    timeout: float
    on_change: Callable[[Path, FileState | None, FileHealthState], None] = lambda p, o, f: None
    clock: Callable[[], float] = time.time
    files: dict[Path, FileHealthState] = field(default_factory=dict)
    objects: dict[ObjRef, _Seen] = field(default_factory=dict)
    owner: dict[ObjRef, Path] = field(default_factory=dict)
    _bucket_counts: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    _sum: float = 0.0
    _count: int = 0

    # --- what the consumer does ------------------------------------------------------------------------
    def applying(self, path: Path, saved: float) -> None:
        """``path`` is being applied (its save, Unix time, starts the save → current clock)."""
        f = self.files.get(path)
        old = f.state if f is not None else None
        self._cancel(f)
        now = self.clock()
        self.files[path] = FileHealthState(FileState.APPLYING, now, min(saved, now),
                                           refs=f.refs if f is not None else ())
        if old is not FileState.APPLYING:
            self.on_change(path, old, self.files[path])

    def applied(self, path: Path, answers: Mapping[ObjRef, Mapping[str, Any]], refs: tuple[ObjRef, ...]) -> None:
        """``path`` was applied: its objects are ``refs``; ``answers`` are the server's answers (fresh objects)."""
        f = self.files.get(path)
        if f is None:
            self.applying(path, self.clock())
            f = self.files[path]
        for ref in f.refs:
            if ref not in refs and self.owner.get(ref) == path:
                del self.owner[ref]
        f.refs = refs
        for ref in refs:
            self.owner[ref] = path
        for ref, obj in answers.items():
            rv, seen = _rv(obj), self.objects.get(ref)
            if seen is not None and seen.rv is not None and rv is not None and seen.rv > rv:
                seen.floor = rv  # the watch already saw it past the answer (a controller was quick)
            else:
                self.objects[ref] = _Seen(rv, compute(obj, group=ref.group, kind=ref.kind), floor=rv)
        loop = asyncio.get_running_loop()
        f.timer = loop.call_later(self.timeout, self._timed_out, path, f) if self.timeout > 0 else None
        f.observed = False
        self._judge(path, f, applied=True)

    def restore(self, path: Path, refs: tuple[ObjRef, ...]) -> None:
        """``path`` was applied by an earlier run: progressing until the watch's list judges its objects."""
        now = self.clock()
        f = self.files[path] = FileHealthState(FileState.PROGRESSING, now, now, refs=refs, observed=True)
        for ref in refs:
            self.owner[ref] = path
        loop = asyncio.get_running_loop()
        f.timer = loop.call_later(self.timeout, self._timed_out, path, f) if self.timeout > 0 else None
        self.on_change(path, None, f)
        self._judge(path, f)

    def apply_failed(self, path: Path, reason: str, message: str) -> None:
        """The server refused part of ``path``: failed at once (the core records the rejection too)."""
        f = self.files.get(path) or FileHealthState(FileState.APPLYING, self.clock(), self.clock())
        self.files[path] = f
        self._cancel(f)
        f.failure, f.culprit = ("", reason, message), None
        self._set(path, f, FileState.FAILED)

    def abandon(self, path: Path) -> None:
        """Handling ``path`` raised before it was applied: forget it if it is still applying."""
        f = self.files.get(path)
        if f is not None and f.state is FileState.APPLYING:
            self.removed(path)

    def untracked(self, path: Path) -> None:
        """``path`` was handled but its health is not tracked (no watch: ``drift = "off"``, ``dry_run``): current."""
        f = self.files.get(path) or FileHealthState(FileState.APPLYING, self.clock(), self.clock())
        self.files[path] = f
        self._cancel(f)
        self._set(path, f, FileState.CURRENT)

    def removed(self, path: Path) -> None:
        """``path`` is gone (or was not applied at all): forget it."""
        f = self.files.pop(path, None)
        self._cancel(f)
        if f is not None:
            for ref in f.refs:
                if self.owner.get(ref) == path:
                    del self.owner[ref]
                    self.objects.pop(ref, None)

    # --- what the watch sees -------------------------------------------------------------------------------
    def observe(self, ref: ObjRef, obj: Mapping[str, Any] | None) -> None:
        """One listed or watched object (``None``: deleted): a new verdict, unless the observation is stale."""
        seen = self.objects.get(ref)
        if obj is None:
            if seen is not None:
                self.objects[ref] = _Seen(None, Verdict(Health.PROGRESSING, "NotFound", "object not found"),
                                          floor=seen.floor)
        else:
            rv = _rv(obj)
            if seen is not None and rv is not None:
                if (seen.floor is not None and rv < seen.floor) or (seen.rv is not None and rv < seen.rv):
                    return  # older than what the apply answered, or than what was seen: stale
            self.objects[ref] = _Seen(rv, compute(obj, group=ref.group, kind=ref.kind),
                                      floor=seen.floor if seen else None)
        path = self.owner.get(ref)
        f = self.files.get(path) if path is not None else None
        if path is not None and f is not None and f.state is not FileState.APPLYING:
            self._judge(path, f)

    # --- reading -----------------------------------------------------------------------------------------
    def verdict(self, ref: ObjRef) -> Verdict | None:
        """The last verdict on ``ref`` (``None``: never seen)."""
        seen = self.objects.get(ref)
        return seen.verdict if seen is not None else None

    def settled(self, paths: Mapping[Path, object] | None = None) -> bool:
        """Whether no file (of ``paths``) is applying or progressing."""
        return not any(f.state in (FileState.APPLYING, FileState.PROGRESSING)
                       for p, f in self.files.items() if paths is None or p in paths)

    def report(self) -> HealthReport:
        """Counts by object health, the files not current, and the save → current histogram."""
        counts: dict[str, int] = {h.value: 0 for h in Health}
        for ref in self.owner:
            seen = self.objects.get(ref)
            counts[(seen.verdict.health if seen is not None else Health.PROGRESSING).value] += 1
        files = tuple(
            FileHealth(str(p), f.state.value, f.since, *f.failure, wave=f.wave)
            for p, f in sorted(self.files.items()) if f.state is not FileState.CURRENT
        )
        cumulative, total = [], 0
        for n in self._bucket_counts:
            total += n
            cumulative.append(total)
        return HealthReport(counts, files, not self.settled(),
                            Histogram(BUCKETS, tuple(cumulative), self._sum, self._count))

    # --- judging -----------------------------------------------------------------------------------------
    def _judge(self, path: Path, f: FileHealthState, *, applied: bool = False) -> None:
        pending: tuple[ObjRef, Verdict] | None = None
        for ref in f.refs:
            v = self.verdict(ref) or Verdict(Health.PROGRESSING, "NotObserved", "not observed yet")
            if v.health is Health.FAILED:
                f.failure, f.culprit = (describe(ref), v.reason, v.message), ref
                self._set(path, f, FileState.FAILED)
                return
            if v.health is not Health.CURRENT and pending is None:
                pending = (ref, v)
        if pending is None:
            f.failure, f.culprit = ("", "", ""), None
            self._cancel(f)
            if not f.observed:
                f.observed = True
                self._observe(self.clock() - f.saved)
            self._set(path, f, FileState.CURRENT)
        elif f.state is not FileState.FAILED or applied:
            ref, v = pending
            f.failure, f.culprit = (describe(ref), v.reason, v.message), ref
            self._set(path, f, FileState.PROGRESSING)

    def _timed_out(self, path: Path, f: FileHealthState) -> None:
        f.timer = None
        if self.files.get(path) is not f or f.state is not FileState.PROGRESSING:
            return
        obj, reason, message = f.failure
        f.failure = (obj, "HealthTimeout", f"not current after {self.timeout:g}s"
                     + (f" ({reason}: {message})" if reason or message else ""))
        self._set(path, f, FileState.FAILED)

    def _set(self, path: Path, f: FileHealthState, state: FileState) -> None:
        old = f.state
        if old is state:
            return
        f.state = state
        f.since = self.clock()
        self.on_change(path, old, f)

    def _cancel(self, f: FileHealthState | None) -> None:
        if f is not None and f.timer is not None:
            f.timer.cancel()
            f.timer = None

    def _observe(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        i = bisect.bisect_left(BUCKETS, seconds)
        if i < len(BUCKETS):
            self._bucket_counts[i] += 1
        self._sum += seconds
        self._count += 1

    def close(self) -> None:
        """Cancel every timer."""
        for f in self.files.values():
            self._cancel(f)
