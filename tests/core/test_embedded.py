"""examples/embedded.py runs reloadd inside another asyncio service, for real."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "embedded.py"


async def get(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    data = await reader.read()
    writer.close()
    return data.split(b"\r\n\r\n", 1)[1].decode()


async def test_embedded_example(tmp_path):
    folder = tmp_path / "greet"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLE), "--dir", str(folder), "--port", "0", stdout=asyncio.subprocess.PIPE
    )
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        assert line.startswith("listening on 127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        assert await get(port) == "nobody has said hello yet\n"
        (folder / "greeting.txt").write_text("hello from disk\n")
        for _ in range(100):
            if await get(port) == "hello from disk\n":
                break
            await asyncio.sleep(0.05)  # asking the service over HTTP, as a user would
        assert await get(port) == "hello from disk\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
