"""``python -m examples.tls_reloader --cert C --key K --port P``: see the package docstring."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path

from aiohttp import web

from reloadd import Reloader, parse_config

from ._consumer import CertPair
from ._pair import PairError, load_pair, read_files

GREETING = b"hello over TLS\n"


async def serve(cert: Path, key: Path, host: str, port: int) -> None:
    """Serve HTTPS (aiohttp) on ``host:port`` until SIGTERM/SIGINT, reloading the pair as it changes."""
    tls = CertPair(cert, key, await asyncio.to_thread(lambda: load_pair(read_files(cert, key))))

    async def greet(request: web.Request) -> web.Response:
        return web.Response(body=GREETING, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/", greet)
    config = parse_config({"reloadd": {"state_dir": ""}})  # "": state in memory, pairs re-read on start
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # The reloader binds the consumer like a configured one (records, its own trigger).
    async with Reloader(config, consumers=[tls]) as reloader:
        try:
            site = web.TCPSite(runner, host, port, ssl_context=tls.front)
            await site.start()
            logging.getLogger("tls_reloader").info("Serving %s from %s and %s", tls.serving, cert, key)
            await reloader.wait_idle()  # the initial pass has seen both files: a rotation from now on is a change
            bound = runner.addresses[0][1]
            print(f"listening on {host}:{bound}", flush=True)
            await stop.wait()
        finally:
            await runner.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m examples.tls_reloader",
                                 description="A TLS server that reloads its certificate and key as they change.")
    ap.add_argument("--cert", type=Path, required=True, help="certificate (chain) file, PEM")
    ap.add_argument("--key", type=Path, required=True, help="private key file, PEM, not encrypted")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8443, help="0 picks a free port (printed)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Absolute but not resolved: reloadd watches the paths as given, symlinks included.
    cert, key = Path(os.path.abspath(args.cert)), Path(os.path.abspath(args.key))
    try:
        asyncio.run(serve(cert, key, args.host, args.port))
    except PairError as exc:
        raise SystemExit(f"tls_reloader: {exc}") from None


if __name__ == "__main__":
    main()
