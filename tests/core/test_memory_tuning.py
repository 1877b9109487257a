"""A process tuned with ``tune_malloc`` gives a large block back when it is freed, whatever was freed before, and
reads files through heap buffers (not a mapping faulted in per read)."""

from __future__ import annotations

import asyncio
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
for _ in range(8):  # a burst's or a walk's tables (4 MiB each), with smaller blocks kept between them
    b = libc.malloc(4 * MiB)
    ctypes.memset(b, 1, 4 * MiB)
    blocks.append(b)
    pins.append(libc.malloc(40 << 10))
held = rss()
for b in blocks:
    libc.free(b)
after = rss()
class Info(ctypes.Structure):  # struct mallinfo2
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
def mapped_while_held(size):  # blocks glibc mapped for a malloc(size) (mapped blocks are never reused)
    base = libc.mallinfo2().hblks
    b = libc.malloc(size)
    n = libc.mallinfo2().hblks - base
    libc.free(b)
    return n
import resource
def faults_of_reads(n):  # pages faulted in by n reads into a fresh 1 MiB buffer each, after a first one
    def read():
        b = libc.malloc(MiB + 64)
        ctypes.memset(b, 1, MiB)
        libc.free(b)
    read()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        read()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
print(json.dumps({"before": before, "held": held, "after": after,
                  "read_buffer_mapped": mapped_while_held(MiB + 64), "table_mapped": mapped_while_held(4 * MiB),
                  "faults_of_8_reads": faults_of_reads(8)}))
"""


def _run(mode: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(out.stdout)
    return result


def test_freed_tables_go_back_to_the_system_once_tuned() -> None:
    tuned = _run("tuned")
    assert tuned["held"] - tuned["before"] >= 30  # the blocks were there
    assert tuned["after"] - tuned["before"] < 4  # and went back when freed
    # Untuned, glibc took the freed 8 MiB block as its new mmap threshold: the 4 MiB blocks came from the
    # heap, and the small blocks between them keep it from shrinking.
    plain = _run("plain")
    assert plain["after"] - plain["before"] >= 28


def test_a_read_buffer_comes_from_the_heap_once_tuned() -> None:
    """A 1 MiB read (a digest's, a tarball's) reuses a heap block: mapped, each one was faulted in page by
    page and unmapped again (~0.5 ms a MiB; an archive landing in the images folder took a third longer)."""
    tuned = _run("tuned")
    assert tuned["read_buffer_mapped"] == 0
    assert tuned["faults_of_8_reads"] < 256  # nor given back at the top of the heap after each (256 pages a read)
    assert tuned["table_mapped"] == 1  # a table of a burst's size still is, and goes back whole


async def test_memory_is_given_back_once_the_start_up_pass_is_over(tmp_path, start_reloader, recorder_cls,
                                                                   monkeypatch) -> None:
    """What loading plugins and records freed is given back when the reloader first falls idle (the idle daemon:
    47.1 MiB without, 45.9 with), not only after a burst of 10,000 paths; and not again until such a burst or a
    rescan (a walk's freed tables stayed below the heap's trim threshold: 10,000 watched files, 56.6 -> 54.0 MiB)."""
    from reloadd import _reloader
    from reloadd._pipeline import _item
    from reloadd._source import EventKind, SourceEvent

    trims: list[float] = []
    monkeypatch.setattr(_reloader, "give_back", lambda: trims.append(1) or True)
    monkeypatch.setattr(_reloader, "_TRIM_DELAY", 0.05)
    watched = tmp_path / "w"
    watched.mkdir()
    (watched / "a.conf").write_text("a")
    rec = recorder_cls([watched])
    r = await start_reloader(rec)
    await rec.wait_path(watched / "a.conf")
    for _ in range(100):
        if trims:
            break
        await asyncio.sleep(0.02)
    assert trims == [1]
    assert not _item._DIR_PARTS  # what only sped up handing the paths over is dropped with the rest
    (watched / "b.conf").write_text("b")  # a handful of changes later: no second trim
    await rec.wait_path(watched / "b.conf")
    await r.wait_idle(5)
    await asyncio.sleep(0.3)
    assert trims == [1]
    # A rescan over (the periodic timer's, SIGHUP's): what its walk freed is given back, once.
    r.engine.emit(SourceEvent(EventKind.RESCAN, None, "rescan"))
    for _ in range(100):
        if len(trims) > 1:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)
    assert trims == [1, 1] and r.engine.stats.rescans == 2


_BURST = r"""
import asyncio, gc, json, os, sys
from pathlib import Path
import reloadd
from reloadd import BaseConsumer, ConsumerContext, Reloader, parse_config
from reloadd._source import EventKind, SourceEvent
root, n = Path(sys.argv[2]), int(sys.argv[3])
if sys.argv[1] == "tuned":
    old = reloadd.tune_gc()
    assert old == (700, 10, 10) and gc.get_threshold() == (50_000, 10, 10)
paths = [str(root / f"f{i:06d}") for i in range(n)]
full = [0]
def count(phase, info):
    if phase == "stop" and info["generation"] == 2:
        full[0] += 1
class Count(BaseConsumer):
    got = 0
    async def handle(self, batch):
        Count.got += len(batch.changes)
        return {}
async def main():
    ctx = ConsumerContext(name="c", paths=(root,), options={}, state_dir=None)
    cfg = parse_config({"reloadd": {"state_dir": "", "rescan_interval": "0s"}})
    async with Reloader(cfg, consumers=[Count(ctx)], sources=[]) as r:
        await r.wait_idle(60)
        for p in paths:  # created once the watch is up: new to the consumer
            with open(p, "w") as f:
                f.write(p)
        gc.callbacks.append(count)
        for i in range(0, n, 500):  # as the inotify source hands reads in
            r.engine.emit_all([SourceEvent(EventKind.WRITTEN, p, "inotify", 2) for p in paths[i:i + 500]])
            await asyncio.sleep(0)
        while Count.got < n:
            await asyncio.sleep(0.01)
        gc.callbacks.remove(count)
asyncio.run(main())
print(json.dumps({"full": full[0], "got": Count.got}))
"""


def test_a_burst_runs_no_full_collection_once_the_collector_is_tuned(tmp_path) -> None:
    """A burst's in-flight objects (pending entries, queued items, changes) die young: untuned, each outlived two
    young collections and the oldest generation's full collections went over all of them, again and again."""

    def burst(mode: str) -> dict[str, int]:
        root = tmp_path / mode
        root.mkdir()
        out = subprocess.run([sys.executable, "-c", _BURST, mode, str(root), "30000"], check=True,
                             capture_output=True, text=True, timeout=120)
        result: dict[str, int] = json.loads(out.stdout)
        return result

    tuned, plain = burst("tuned"), burst("plain")
    assert tuned["got"] == plain["got"] == 30000
    assert plain["full"] >= 2
    assert tuned["full"] == 0
