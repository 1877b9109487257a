"""Import tarballs with the consumer in a fresh process (what the benchmark times against ctr).

usage: python -m bench.containerd_images.import_once [--options JSON] SOCKET CONCURRENCY FILE...

``--options`` adds consumer options (``{"verify": "require", "trusted_keys": [...]}``).
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


async def main(address: str, concurrency: int, files: list[Path], extra: dict[str, object] | None = None
               ) -> dict[str, float]:
    root = files[0].parent
    ctx = ConsumerContext(
        name="bench",
        paths=(root,),
        options={"address": address, "concurrency": concurrency, **(extra or {})},
        state_dir=Path(tempfile.mkdtemp()),
        logger=logging.getLogger("bench"),
    )
    consumer = create(ctx)
    t0 = time.monotonic()
    changes = tuple(Change(f, ChangeKind.ADDED, Fingerprint.from_stat(os.stat(f)), root=root) for f in files)
    res = await consumer.handle(Batch("bench", Reason.STARTUP, changes))
    dt = time.monotonic() - t0
    await consumer.close()
    bad = {str(p): r for p, r in res.items() if not isinstance(r, Ack)}
    if bad:
        raise SystemExit(f"import failed: {bad}")
    stats = dict(getattr(consumer, "stats", {}))
    stats["seconds"] = dt
    stats["cpu_seconds"] = sum(os.times()[:2])  # this process, user + system (what a signature check adds)
    stats["max_rss_mb"] = _peak_rss_mb()
    return stats


if __name__ == "__main__":
    args = sys.argv[1:]
    extra = json.loads(args[1]) if args[:1] == ["--options"] else None
    args = args[2:] if extra is not None else args
    out = asyncio.run(main(args[0], int(args[1]), [Path(a) for a in args[2:]], extra))
    print(json.dumps(out))
