"""What the demo's modules share: its sample names, how it prints, how it waits and runs a command."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable

__all__ = ["BOLD", "DIM", "IMAGE_V1", "IMAGE_V2", "RESET", "SAMPLE_DROPS", "run_command", "say", "until"]

IMAGE_V1 = "docker.io/demo/hello:v1"
IMAGE_V2 = "docker.io/demo/hello:v2"
SAMPLE_DROPS = (("images", "hello.tar"), ("registries.conf.d", "50-demo-mirror.conf"), ("manifests", "hello.yaml"))
"""(folder, file) of each sample a smoke run drops."""

BOLD, DIM, RESET = ("\033[1m", "\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "", "")


def say(text: str = "") -> None:
    """Print a line of the demo's own output (reloadd's logs go to stderr)."""
    print(text, flush=True)


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 90.0) -> None:
    """Wait until ``check()`` is true (polled every 0.2 s: files and CLI output send no event)."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def run_command(*argv: str) -> tuple[int, str]:
    """Run ``argv``; its exit code and combined output."""
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")
