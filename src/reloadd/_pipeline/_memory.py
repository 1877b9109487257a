"""Memory given back after a burst: the process returns to its size before it, not its peak.

CPython frees the objects of a burst (settling entries, queued items, changes), but glibc's
``malloc`` keeps the freed pages of its arenas for reuse: without a trim, a daemon that once
settled 100,000 paths holds tens of MiB more until it exits. :func:`give_back` asks glibc to
return them (``malloc_trim(0)``); elsewhere (musl, another libc) it does nothing.
:func:`tune_malloc` (``reloadd run``) keeps freed large blocks from reaching the heap at all, and
:func:`tune_gc` (``reloadd run``) keeps the cyclic collector from going over a burst's objects again and again.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import logging

__all__ = ["give_back", "tune_gc", "tune_malloc"]

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_MMAP_THRESHOLD = 2 << 20
"""Blocks from this size up are mapped and unmapped whole: a burst's tables (100,000 paths: 4-5 MiB each). Below
it come the I/O buffers (1 MiB reads of a digest or a tarball, their protobuf copies): mapped, each was faulted in
page by page and unmapped again, ~0.5 ms a MiB (a 478 MiB digest 0.32 -> 0.54 s; an archive landing in the
images folder took a third longer)."""
_TRIM_THRESHOLD = 2 * _MMAP_THRESHOLD
"""Free memory kept at the top of the heap (glibc's own rule while its threshold moves): at its default (128 KiB)
each 1 MiB buffer freed at the top was given back and faulted in again by the next read."""

_GC_YOUNG = 50_000
"""New container objects between two young collections (CPython's default: 700)."""

log = logging.getLogger("reloadd.memory")


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library the interpreter runs on (its symbols, as already loaded: no ``ldconfig`` run)."""
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def _trim() -> ctypes._NamedFuncPointer | None:
    libc = _libc()
    fn = getattr(libc, "malloc_trim", None) if libc is not None else None  # absent: not glibc
    if fn is not None:
        fn.argtypes = [ctypes.c_size_t]
        fn.restype = ctypes.c_int
    return fn


def tune_malloc(arenas: int = 2) -> bool:
    """Tune glibc's ``malloc`` for a process that is mostly reloadd; whether the C library took it.

    - At most ``arenas`` arenas: by default each thread that allocates may get an arena of its own (up
      to 8 per core), and each keeps the pages it once used: the daemon's worker threads (walks,
      digests, file reads) each held a few MiB after a pass.
    - A fixed mmap threshold (:data:`_MMAP_THRESHOLD`, 2 MiB): by default glibc raises the threshold to
      the size of any mapped block freed, so once a burst's 5 MiB table is freed, every later table
      under that size (a walk's sets, a copy of the records) comes from the heap, whose freed middle
      stays resident: 100,000 watched files held 7 MiB more at rest, and a periodic rescan after a burst
      added 4-6 MiB each time. Fixed, a large block is mapped and unmapped whole; the 1 MiB buffers of
      file reads stay below it (heap blocks reused from one read to the next), with
      :data:`_TRIM_THRESHOLD` kept free at the top of the heap.

    ``reloadd run`` calls it first thing. A reloader embedded in another application leaves the
    allocator alone; an application whose process is mostly reloadd (a node agent, a sidecar) may call
    it once, before it starts threads. Elsewhere (musl, another libc) it does nothing.
    """
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    took = [mallopt(_M_ARENA_MAX, arenas), mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD),  # each, whatever the others did
            mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)]
    return all(took)


def tune_gc(young: int = _GC_YOUNG) -> tuple[int, int, int]:
    """Run the cyclic collector's young collection every ``young`` new container objects instead of every 700, for
    a process that is mostly reloadd; returns the thresholds it replaced (``gc.set_threshold(*old)`` puts them back).

    A burst keeps tens of thousands of objects alive for a few tens of milliseconds each (a path's pending
    entry, its queued item, its change). At 700, each of them outlived two young collections and was moved to
    the oldest generation, whose full collections then went over every object the process held, again and
    again: in a burst of 100,000 created files, 10 full collections and ~110 of the middle generation, 0.23 s of
    its 3.2 s of CPU (engine alone, a created path 30.5 µs, 26.1 once tuned). At 50,000 they die young.
    Objects are still freed when their last reference goes (reference counting); only cycles wait longer. The
    older generations' thresholds are kept.

    ``reloadd run`` calls it first thing. A reloader embedded in another application leaves the collector alone;
    an application whose process is mostly reloadd may call it once.
    """
    old = gc.get_threshold()
    gc.set_threshold(young, old[1], old[2])
    return old[0], old[1], old[2]


def give_back() -> bool:
    """Return the free pages of the C heap to the system; whether the C library can."""
    trim = _trim()
    if trim is None:
        return False
    trim(0)
    log.debug("Returned freed heap memory to the system")
    return True
