"""Memory given back after a burst: the process returns to its size before it, not its peak.

CPython frees the objects of a burst (settling entries, queued items, changes), but glibc's
``malloc`` keeps the freed pages of its arenas for reuse: without a trim, a daemon that once
settled 100,000 paths holds tens of MiB more until it exits. :func:`give_back` asks glibc to
return them (``malloc_trim(0)``); elsewhere (musl, another libc) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

__all__ = ["give_back"]

log = logging.getLogger("reloadd.memory")


@functools.cache
def _trim() -> ctypes._NamedFuncPointer | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def give_back() -> bool:
    """Return the free pages of the C heap to the system; whether the C library can."""
    trim = _trim()
    if trim is None:
        return False
    trim(0)
    log.debug("Returned freed heap memory to the system")
    return True
