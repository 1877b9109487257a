"""The inotify source's reader thread: an inotify fd read as fast as the kernel fills it.

The kernel queue holds ``fs.inotify.max_queued_events`` (16,384 by default): a writer at full speed fills it in
~60 ms, less than one busy turn of an event loop settling a burst. :class:`Reader` reads it in a thread of its own
and queues the reads (bounded) for the loop, which parses them (:mod:`reloadd._sources.inotify`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import select
import struct
import threading
import time
from collections.abc import Callable

from asyncinotify import Mask

__all__ = ["HEADER", "OVERFLOW", "OVERFLOW_EVENT", "Reader"]

_READ_BYTES = 64 * 1024  # one read is parsed without yielding the loop: ~1,300 events, a few ms
_QUEUED_MAX = 64 << 20  # bytes of events read and not yet handled, at most (~2M events)
_GATHER = 0.004  # seconds a read waits when the previous one was this recent (a burst)
HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)
OVERFLOW = int(Mask.Q_OVERFLOW)  # a plain int for the per-event hot path: IntFlag membership tests cost ~15x more
OVERFLOW_EVENT = HEADER.pack(-1, OVERFLOW, 0, 0)
"""An overflow as the kernel writes it, found in a read with one search (bytes of a name that read like one
only make the source parse on without waiting for room)."""


class Reader:
    """Read an inotify fd in a thread of its own, as fast as the kernel fills it; the loop takes the reads.

    The kernel queue holds ``fs.inotify.max_queued_events`` (16,384 by default): a writer at
    full speed fills it in ~60 ms, less than one busy turn of an event loop settling a burst.
    Read here, events wait in memory instead (bounded by :data:`_QUEUED_MAX`; beyond that reads
    are dropped and :attr:`dropped` set, which the source treats as an overflow: rescan).
    """

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop, wake: Callable[[], None]) -> None:
        self.fd = fd
        self.loop = loop
        self.wake = wake
        self.error: OSError | None = None
        self.dropped = False
        self.marked = 0  # reads queued that hold an overflow (see OVERFLOW_EVENT)
        self._chunks: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._lock = threading.Lock()
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread = threading.Thread(target=self._run, name="reloadd-inotify-reader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def take(self) -> bytes | None:
        """The oldest read not handled yet, if any (on the loop)."""
        with self._lock:
            if not self._chunks:
                return None
            data = self._chunks.popleft()
            self._queued -= len(data)
            if OVERFLOW_EVENT in data:
                self.marked -= 1
            return data

    def stop(self) -> None:
        """End the thread and release its pipe (blocking: call it off the loop)."""
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        if self._thread.is_alive():
            self._thread.join()
        os.close(self._stop_r)
        os.close(self._stop_w)

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        last = -float("inf")
        while True:
            ready = poller.poll()
            if any(fd == self._stop_r for fd, _ in ready):
                return
            if time.monotonic() - last < _GATHER:
                # Events are streaming in (a burst): let a window of them pile up in the kernel and
                # take them in one read, not a read (and a turn of the loop) per file. The first
                # event after a quiet spell is read at once.
                time.sleep(_GATHER)
            got = False
            while True:
                try:
                    data = os.read(self.fd, _READ_BYTES)
                except BlockingIOError:
                    break
                except OSError as exc:
                    self.error = exc
                    got = True
                    break
                if not data:
                    break
                got = True
                with self._lock:
                    if self._queued + len(data) > _QUEUED_MAX:
                        self.dropped = True
                    else:
                        self._chunks.append(data)
                        self._queued += len(data)
                        if OVERFLOW_EVENT in data:
                            self.marked += 1
            last = time.monotonic()
            if got:
                try:
                    self.loop.call_soon_threadsafe(self.wake)
                except RuntimeError:
                    return  # the loop is closed
            if self.error is not None:
                return
