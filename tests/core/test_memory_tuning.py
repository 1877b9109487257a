"""A process tuned with ``tune_malloc`` gives a large block back when it is freed, whatever was freed before."""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = r"""
import ctypes, json, sys
if sys.argv[1] == "tuned":
    import reloadd
    assert reloadd.tune_malloc()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
MiB = 1 << 20
libc.free(libc.malloc(8 * MiB))  # a burst's table, freed
before = rss()
blocks, pins = [], []
for _ in range(32):  # a walk's tables (1 MiB each), with smaller blocks kept between them
    b = libc.malloc(MiB)
    ctypes.memset(b, 1, MiB)
    blocks.append(b)
    pins.append(libc.malloc(40 << 10))
held = rss()
for b in blocks:
    libc.free(b)
print(json.dumps({"before": before, "held": held, "after": rss()}))
"""


def _run(mode: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(out.stdout)
    return result


def test_freed_tables_go_back_to_the_system_once_tuned() -> None:
    tuned = _run("tuned")
    assert tuned["held"] - tuned["before"] >= 30  # the blocks were there
    assert tuned["after"] - tuned["before"] < 4  # and went back when freed
    # Untuned, glibc took the freed 8 MiB block as its new mmap threshold: the 1 MiB blocks came from the
    # heap, and the small blocks between them keep it from shrinking.
    plain = _run("plain")
    assert plain["after"] - plain["before"] >= 28
