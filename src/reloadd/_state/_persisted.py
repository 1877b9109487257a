"""How a consumer's persisted state is doing: files set aside at load, and writes that fail.

One rule for every file kept under ``state_dir`` (records snapshot and journal, held removals,
a plugin's own file): one that cannot be read is **moved aside** with a timestamp suffix
(:func:`set_aside`, never deleted), its consumer starts from the safest assumption (the loader
says which), one WARNING names the file, where it went and what was assumed, and status shows
it until the next successful write. Other consumers are untouched: a damaged file of one
consumer never stops the daemon, as containerd, etcd and systemd treat their own state.

A write that fails (disk full, read-only remount, EIO) does not stop the consumer: it keeps
delivering, its acknowledgements stay buffered in memory and are written once the disk takes
them (a restart before then hands those paths over again: at least once, never lost).
:class:`PersistHealth` makes that loud once and then counts: status says
``STATE NOT PERSISTED since HH:MM:SS: <cause> (<path>)``, one log line per cause per minute
carries the count of the ones suppressed, and the next attempt backs off (0.5 s doubling to
15 s) instead of retrying with every batch.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._backoff import Backoff
from .._errors import StateError

__all__ = ["PersistHealth", "SetAside", "set_aside"]

log = logging.getLogger("reloadd.state")

LOG_EVERY = 60.0
"""Seconds between two log lines of one persist failure cause (the others are counted)."""

RETRY = Backoff(0.5, 15.0, jitter=False)
"""Delays between attempts to persist while writes fail."""


@dataclass(frozen=True, slots=True)
class SetAside:
    """A state file that could not be read, and what became of it.

    Attributes:
        file: Where it was.
        moved_to: Where it is now (``None``: it could not be moved, e.g. a read-only mount).
        why: Why it could not be read.
        assumed: What the consumer assumed instead.
        at: Wall-clock time.
    """

    file: str
    moved_to: str | None
    why: str
    assumed: str
    at: float

    def line(self) -> str:
        """The operator's sentence (log and status)."""
        where = f"moved aside to {self.moved_to}" if self.moved_to else "could not be moved aside"
        return f"state file {self.file} cannot be read ({self.why}): {where}; {self.assumed}"


def set_aside(path: Path, why: str, assumed: str, *, copy: bool = False,
              clock: Callable[[], float] = time.time) -> SetAside:
    """Move (or with ``copy``, copy) an unreadable state file to ``<name>.broken-<UTC timestamp>``; one WARNING.

    Never deletes: the bytes stay for whoever wants to know what happened. ``copy`` keeps the file in
    place (a journal whose good lines are still used; the caller then repairs it in place).
    """
    now = clock()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    target = path.with_name(f"{path.name}.broken-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.broken-{stamp}.{n}")
    moved: str | None = str(target)
    try:
        if copy:
            with open(path, "rb") as src, open(target, "xb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        else:
            os.rename(path, target)
    except OSError as exc:
        moved = None
        why = f"{why}; moving it aside failed: {exc.strerror or exc}"
    entry = SetAside(str(path), moved, why, assumed, now)
    log.warning("%s", entry.line()[0].upper() + entry.line()[1:])
    return entry


class PersistHealth:
    """One consumer's persistence: what was set aside at load, and whether writes succeed now.

    Args:
        name: The consumer (for log lines).
        clock: Wall clock (``since`` times, the status line).
        monotonic: Monotonic clock (backoff, log rate).
    """

    def __init__(self, name: str, *, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._clock = clock
        self._monotonic = monotonic
        self.set_aside: list[SetAside] = []
        """Files set aside since the last successful write (status lists them)."""
        self.set_aside_total = 0
        """Files set aside since start (``reloadd_state_files_set_aside_total``)."""
        self.write_errors = 0
        """Writes that failed since start (``reloadd_state_write_errors_total``)."""
        self.failing_since: float | None = None
        """Wall-clock time of the first failure of the current streak (``None``: persisted)."""
        self.cause: str | None = None
        self.path: str | None = None
        self.last_success = clock()
        """Wall-clock time of the last successful write (or of the start: what was loaded was on disk)."""
        self._streak = 0
        self._retry_at = float("-inf")
        # cause -> (when last logged, failures not logged since): kept across streaks, so a nearly full disk
        # that takes one write in two still logs once a minute
        self._logged: dict[str, tuple[float, int]] = {}
        self._recovery_logged = float("-inf")

    @property
    def persisted(self) -> bool:
        """No write is failing right now."""
        return self.failing_since is None

    def add(self, entry: SetAside) -> None:
        """A loader set a file aside (it logged the WARNING)."""
        self.set_aside.append(entry)
        self.set_aside_total += 1

    def retry_in(self) -> float:
        """Seconds until the next attempt to write (0: write now)."""
        return max(0.0, self._retry_at - self._monotonic())

    def succeeded(self) -> None:
        """A write went through: the streak (and the set-aside notes) end."""
        if self.failing_since is not None:
            now = self._monotonic()
            if now - self._recovery_logged >= LOG_EVERY:  # a disk that flaps says so once a minute
                self._recovery_logged = now
                log.warning("State of consumer %s is persisted again, after %d failed writes since %s",
                            self.name, self._streak, _hms(self.failing_since))
        self.failing_since = None
        self.cause = self.path = None
        self._streak = 0
        self._retry_at = float("-inf")
        self.set_aside.clear()
        self.last_success = self._clock()

    def failed(self, exc: StateError) -> None:
        """A write failed: count it, log it (once per cause per minute), back off the next attempt."""
        cause = exc.cause or str(exc)
        self.write_errors += 1
        self._streak += 1
        if self.failing_since is None:
            self.failing_since = self._clock()
        self.cause, self.path = cause, exc.path
        now = self._monotonic()
        self._retry_at = now + RETRY.delay(self._streak)
        last, suppressed = self._logged.get(cause, (float("-inf"), 0))
        if now - last < LOG_EVERY:
            self._logged[cause] = (last, suppressed + 1)
            return
        self._logged[cause] = (now, 0)
        more = f" ({suppressed} more like it since the last line, not logged)" if suppressed else ""
        log.error("Failed to persist state of consumer %s: %s%s; it keeps delivering, retrying in %.1fs",
                  self.name, exc, more, self.retry_in())

    def note(self) -> str | None:
        """``STATE NOT PERSISTED since 12:00:01: No space left on device (…/records.journal.0)``, or ``None``."""
        if self.failing_since is None:
            return None
        return f"STATE NOT PERSISTED since {_hms(self.failing_since)}: {self.cause} ({self.path or '?'})"

    def seconds_since_success(self) -> float:
        """Seconds since the last successful write (0 while persisted: nothing waits to be written)."""
        return 0.0 if self.failing_since is None else max(0.0, self._clock() - self.last_success)

    def status(self) -> dict[str, Any]:
        """The ``state`` part of a consumer's status document."""
        return {
            "persisted": self.failing_since is None,
            "not_persisted": self.note(),
            "failing_since": self.failing_since,
            "cause": self.cause,
            "path": self.path,
            "write_errors": self.write_errors,
            "last_persisted": self.last_success,
            "set_aside": [
                {"file": e.file, "moved_to": e.moved_to, "why": e.why, "assumed": e.assumed, "at": e.at}
                for e in self.set_aside
            ],
        }


def _hms(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))
