"""reloadd embedded in another asyncio service.

A tiny HTTP service answers ``GET /`` with the current contents of ``greeting.txt``.
Its own consumer (an object, no plugin needed) swaps the greeting the moment the file
settles on disk; the service never re-reads the file per request and never restarts.

    python examples/embedded.py --dir /tmp/greet --port 8088
    echo hello > /tmp/greet/greeting.txt; curl localhost:8088/

The service owns the process: it installs SIGTERM/SIGINT itself, and reloadd leaves
every signal alone (no ``install_signal_handlers``). It wants no persistence either:
``state_dir = ""`` keeps reloadd's state in memory, so a restart simply re-reads the file.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Mapping
from pathlib import Path

from reloadd import (
    Ack,
    BaseConsumer,
    Batch,
    ChangeKind,
    ConsumerContext,
    Reject,
    Reloader,
    Result,
    parse_config,
)


class Greeting(BaseConsumer):
    """Keep ``self.text`` equal to the watched greeting file."""

    def __init__(self, folder: Path) -> None:
        super().__init__(ConsumerContext(name="greeting", paths=(folder,), options={}, state_dir=folder))
        self.text = "nobody has said hello yet\n"

    def accepts(self, path: Path) -> bool:
        return path.name == "greeting.txt"

    async def handle(self, batch: Batch) -> Mapping[Path, Result]:
        results: dict[Path, Result] = {}
        for change in batch.changes:
            if change.kind is ChangeKind.DELETED:
                self.text = "the greeting was removed\n"
            else:
                raw = change.path.read_bytes()
                if len(raw) > 4096:
                    results[change.path] = Reject("greeting longer than 4 KiB")
                    continue
                self.text = raw.decode("utf-8", errors="replace")
            results[change.path] = Ack()
        return results


async def serve(folder: Path, port: int) -> None:
    greeting = Greeting(folder)

    async def http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = greeting.text.encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    config = parse_config({"reloadd": {"state_dir": "", "quiet": "100ms"}})  # "": state in memory
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await asyncio.start_server(http, "127.0.0.1", port)
    async with server, Reloader(config, consumers=[greeting]):
        print(f"listening on 127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
        await stop.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--port", type=int, default=8088)
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(serve(args.dir, args.port))


if __name__ == "__main__":
    main()
