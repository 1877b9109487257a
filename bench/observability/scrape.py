"""Cost of a /metrics scrape and a status request as a consumer's folder grows.

    python -m bench.observability.scrape [N ...]

For each N: N files acknowledged by an embedded consumer, then 50 scrapes of /metrics
over HTTP and 50 status requests over the control socket, on the daemon's own loop
(a scrape runs on the event loop, so its time is loop time the engine does not get).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from reloadd import BaseConsumer, Batch, ConsumerContext, Reloader, Result, parse_config
from reloadd._ops._control import request
from reloadd._ops._services import services
from tests.observability.support import http_get


class Acker(BaseConsumer):
    """Acknowledges everything."""

    content_digest = False

    def __init__(self, root: Path) -> None:
        super().__init__(ConsumerContext(name="bench", paths=(root,), options={}, state_dir=root))

    async def handle(self, batch: Batch) -> Mapping[Path, Result]:
        return {}


async def one(n: int) -> dict[str, float]:
    d = Path(tempfile.mkdtemp(prefix="rld-bench-", dir="/tmp"))
    try:
        root = d / "files"
        root.mkdir()
        for i in range(n):
            (root / f"f{i:06d}").write_bytes(b"x")
        cfg = parse_config({"reloadd": {"state_dir": str(d / "state"), "quiet": "10ms",
                                        "metrics_listen": "127.0.0.1:0", "control_socket": str(d / "c.sock"),
                                        "rescan_interval": "0s"}})
        r = Reloader(cfg, consumers=[Acker(root)])
        async with services(r, notify_socket="") as svc, r:
            await r.wait_idle(600)
            url = svc.metrics_url or ""
            scrape, status = [], []
            for _ in range(50):
                t = time.perf_counter()
                code, _, body = await http_get(url)
                scrape.append(time.perf_counter() - t)
                assert code == 200 and body
                t = time.perf_counter()
                await asyncio.to_thread(request, d / "c.sock", "status")
                status.append(time.perf_counter() - t)
        return {"files": n, "scrape_ms_p50": statistics.median(scrape) * 1e3,
                "scrape_ms_max": max(scrape) * 1e3, "status_ms_p50": statistics.median(status) * 1e3}
    finally:
        shutil.rmtree(d, ignore_errors=True)


async def main(sizes: list[int]) -> None:
    print("| files | /metrics p50 ms | /metrics max ms | status p50 ms |")
    print("|---:|---:|---:|---:|")
    for n in sizes:
        res = await one(n)
        print(f"| {n} | {res['scrape_ms_p50']:.2f} | {res['scrape_ms_max']:.2f} | {res['status_ms_p50']:.2f} |",
              flush=True)


if __name__ == "__main__":
    asyncio.run(main([int(a) for a in sys.argv[1:]] or [100, 10_000, 50_000]))
