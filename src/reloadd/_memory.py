"""Memory given back after a burst: the process returns to its size before it, not its peak.

CPython frees the objects of a burst (settling entries, queued items, changes), but glibc's
``malloc`` keeps the freed pages of its arenas for reuse: without a trim, a daemon that once
settled 100,000 paths holds tens of MiB more until it exits. :func:`give_back` asks glibc to
return them (``malloc_trim(0)``); elsewhere (musl, another libc) it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import logging

__all__ = ["give_back", "limit_arenas"]

_M_ARENA_MAX = -8  # glibc's mallopt parameter number (malloc.h)

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


def limit_arenas(arenas: int = 2) -> bool:
    """Have glibc's ``malloc`` use at most ``arenas`` arenas; whether the C library took it.

    By default each thread that allocates may get an arena of its own (up to 8 per core), and each keeps
    the pages it once used: the daemon's worker threads (walks, digests, file reads) each held a few MiB
    after a pass. For the daemon's own process only (``reloadd run``), before its threads start; an
    application embedding a reloader keeps its allocator settings.
    """
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))


def give_back() -> bool:
    """Return the free pages of the C heap to the system; whether the C library can."""
    trim = _trim()
    if trim is None:
        return False
    trim(0)
    log.debug("Returned freed heap memory to the system")
    return True
