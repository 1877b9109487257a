"""A headless Chromium (Debian's ``chromium``) driven over the DevTools protocol, with aiohttp's websocket.

Only what the site test needs: open a page, wait for its load event, evaluate JavaScript, and collect
the exceptions the page throws.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp


def chromium_binary() -> str:
    """Debian's chromium (scripts/infra/install-deps.sh installs it)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "chromium is not installed: run `make deps` (scripts/infra/install-deps.sh)"
    return found


def chromium_args(profile: Path) -> list[str]:
    """Headless, as root, and quiet on the network: nothing but the pages asked for is fetched."""
    return [chromium_binary(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-extensions", "--disable-background-networking", "--disable-sync",
            "--disable-component-update", "--disable-default-apps", "--metrics-recording-only",
            f"--user-data-dir={profile}"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Page:
    """One tab."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._events: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self.exceptions: list[str] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self._ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self._pending:
                fut = self._pending.pop(data["id"])
                if "error" in data:
                    fut.set_exception(RuntimeError(f"DevTools: {data['error']}"))
                else:
                    fut.set_result(data.get("result", {}))
            elif data.get("method") == "Runtime.exceptionThrown":
                details = data["params"]["exceptionDetails"]
                self.exceptions.append(details.get("exception", {}).get("description") or details.get("text", ""))
            elif "method" in data:
                self._events.setdefault(data["method"], asyncio.Queue()).put_nowait(data["params"])

    async def send(self, method: str, **params: Any) -> Any:
        """One DevTools command; its result."""
        msg_id = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = fut
        await self._ws.send_str(json.dumps({"id": msg_id, "method": method, "params": params}))
        return await asyncio.wait_for(fut, 30)

    async def goto(self, url: str) -> None:
        """Navigate and wait for the load event."""
        queue = self._events.setdefault("Page.loadEventFired", asyncio.Queue())
        while not queue.empty():
            queue.get_nowait()
        await self.send("Page.navigate", url=url)
        await asyncio.wait_for(queue.get(), 30)

    async def js(self, expression: str) -> Any:
        """Evaluate ``expression`` (awaiting a promise); its JSON value."""
        res = await self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"JavaScript failed: {res['exceptionDetails']}")
        return res["result"].get("value")

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


@contextlib.asynccontextmanager
async def browser_page(profile: Path) -> AsyncIterator[Page]:
    """A headless Chromium with one page, closed (and the process ended) on exit."""
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        *chromium_args(profile), f"--remote-debugging-port={port}", "about:blank",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        async with aiohttp.ClientSession() as http:
            targets: list[dict[str, Any]] = []
            for _ in range(150):  # the DevTools endpoint answers once chromium is up
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
                        targets = [t for t in await resp.json() if t.get("type") == "page"]
                if targets or proc.returncode is not None:
                    break
                await asyncio.sleep(0.2)
            assert targets, f"chromium did not start (exit {proc.returncode})"
            async with http.ws_connect(targets[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                try:
                    await page.send("Page.enable")
                    await page.send("Runtime.enable")
                    yield page
                finally:
                    await page.close()
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()
