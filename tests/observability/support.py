"""Helpers for the observability tests: an exec hook we control, an async HTTP client, a daemon runner."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

HOOK = r'''
import json, os, sys, pathlib
d = pathlib.Path(sys.argv[1])
batch = json.load(sys.stdin)
with open(d / "calls.jsonl", "a") as f:
    f.write(json.dumps(batch) + "\n")
code = int((d / "exit_code").read_text()) if (d / "exit_code").exists() else 0
if code:
    print((d / "message").read_text() if (d / "message").exists() else "hook failed")
sys.exit(code)
'''


@dataclass
class Hook:
    """An ``exec`` command recording each batch in ``calls.jsonl``; exits with what ``fail()`` says."""

    dir: Path

    @classmethod
    def make(cls, d: Path) -> Hook:
        d.mkdir(parents=True, exist_ok=True)
        (d / "hook.py").write_text(HOOK)
        return cls(d)

    @property
    def command(self) -> list[str]:
        return [sys.executable, str(self.dir / "hook.py"), str(self.dir)]

    def fail(self, code: int = 1, message: str = "hook failed") -> None:
        (self.dir / "message").write_text(message)
        (self.dir / "exit_code").write_text(str(code))

    def succeed(self) -> None:
        (self.dir / "exit_code").write_text("0")

    def calls(self) -> list[dict[str, Any]]:
        try:
            text = (self.dir / "calls.jsonl").read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def short_dir() -> Path:
    """A private dir under /tmp: unix socket paths must stay under 108 bytes."""
    return Path(tempfile.mkdtemp(prefix="rld-", dir="/tmp"))


async def http_get(url: str, accept: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """GET ``url`` (``http://host:port/path``) without blocking the loop."""
    rest = url.removeprefix("http://")
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    try:
        extra = f"Accept: {accept}\r\n" if accept else ""
        writer.write(f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\n{extra}Connection: close\r\n\r\n".encode())
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return status, headers, body


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_metrics(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, keyed by (name, labels)."""
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def sample(samples: Samples, metric: str, /, **labels: str) -> float | None:
    """One sample's value (``None`` when absent)."""
    return samples.get((metric, frozenset(labels.items())))


async def scrape(base: str) -> Samples:
    status, _, body = await http_get(base + "/metrics")
    assert status == 200, body
    return parse_metrics(body.decode())


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Daemon:
    """A ``reloadd run`` subprocess."""

    proc: asyncio.subprocess.Process
    config: Path
    stderr_path: Path

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    async def cli(self, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        """Run ``reloadd <args> --config <config>``; return (exit code, stdout, stderr)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "reloadd", *args, "--config", str(self.config),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    async def stop(self) -> int:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        assert self.proc.returncode is not None
        return self.proc.returncode


@contextlib.asynccontextmanager
async def run_daemon(config: Path, *args: str, env: dict[str, str] | None = None) -> AsyncIterator[Daemon]:
    """Start ``reloadd [args] run --config config``; SIGTERM it on exit."""
    err = config.parent / "daemon.stderr"
    with open(err, "wb") as f:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "reloadd", *args, "run", "--config", str(config),
            stdin=asyncio.subprocess.DEVNULL, stdout=f, stderr=f,
            env={**os.environ, **(env or {})},
        )
    d = Daemon(proc, config, err)
    try:
        yield d
    finally:
        await d.stop()
