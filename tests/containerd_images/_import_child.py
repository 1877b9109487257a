"""Run one import in a fresh process and report its peak memory and event-loop lag (JSON on stdout).

usage: python _import_child.py SOCKET FILE
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from reloadd_containerd_images import create

from reloadd import Ack, Batch, Change, ChangeKind, ConsumerContext, Fingerprint, Reason


def _peak_rss_mb() -> float:
    """VmHWM of this process image (``ru_maxrss`` would include the parent's RSS at fork)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def main(address: str, path: Path) -> dict[str, object]:
    ctx = ConsumerContext(
        name="child",
        paths=(path.parent,),
        options={"address": address},
        state_dir=Path(tempfile.mkdtemp()),
        logger=logging.getLogger("child"),
    )
    consumer = create(ctx)
    lag = 0.0
    stop = False

    async def ticker() -> None:
        nonlocal lag
        while not stop:
            t = time.monotonic()
            await asyncio.sleep(0.01)
            lag = max(lag, time.monotonic() - t - 0.01)

    tick = asyncio.create_task(ticker())
    change = Change(path, ChangeKind.ADDED, Fingerprint.from_stat(os.stat(path)), root=path.parent)
    res = await consumer.handle(Batch("child", Reason.STARTUP, (change,)))
    stop = True
    await tick
    await consumer.close()
    return {"ok": isinstance(res[path], Ack), "result": repr(res[path]), "max_lag": lag, "max_rss_mb": _peak_rss_mb()}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], Path(sys.argv[2])))))
