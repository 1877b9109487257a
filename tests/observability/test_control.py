"""The control socket's edges: stale sockets, a second daemon, bad requests, redaction; busy listen addresses."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from reloadd import ConfigError, ReloaddError, Reloader, parse_config
from reloadd._ops._control import ControlServer, redact, request
from reloadd._ops._services import services

from .support import short_dir

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def sdir() -> Iterator[Path]:
    d = short_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def reloader(d: Path, **settings: object) -> Reloader:
    return Reloader(parse_config({"reloadd": {"state_dir": str(d / "state"), **settings}}))


async def test_stale_socket_is_replaced_and_a_live_one_is_refused(sdir: Path) -> None:
    path = sdir / "run" / "ctl.sock"
    path.parent.mkdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # what a kill -9 leaves behind: a socket file nobody listens on
    first = ControlServer(reloader(sdir), path)
    await first.start()
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        second = ControlServer(reloader(sdir), path)
        with pytest.raises(ReloaddError, match="Another reloadd is serving"):
            await second.start()
        reply = await asyncio.to_thread(request, path, "status")
        assert reply["status"]["pid"] == os.getpid()
    finally:
        await first.close()
    assert not path.exists()


async def test_a_regular_file_is_never_removed(sdir: Path) -> None:
    path = sdir / "ctl.sock"
    path.write_text("not a socket")
    with pytest.raises(ConfigError, match="is not a socket"):
        await ControlServer(reloader(sdir), path).start()
    assert path.read_text() == "not a socket"


async def test_bad_requests_get_an_error_reply(sdir: Path) -> None:
    path = sdir / "ctl.sock"
    server = ControlServer(reloader(sdir), path)
    await server.start()
    try:
        for line, expected in ((b"garbage\n", "expected one JSON line"), (b'{"command": "rm -rf"}\n', "unknown")):
            reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(line)
            reply = json.loads(await reader.readline())
            writer.close()
            assert reply["ok"] is False and expected in reply["error"]
        with pytest.raises(ReloaddError, match="unknown command"):
            await asyncio.to_thread(request, path, "explode")
    finally:
        await server.close()


async def test_busy_metrics_address_is_a_clear_error(sdir: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = reloader(sdir, metrics_listen=f"127.0.0.1:{port}")
        with pytest.raises(ReloaddError, match=rf"Failed to listen on 127\.0\.0\.1:{port} \(metrics_listen\)"):
            async with services(r, notify_socket=""):
                pass


def test_redact_hides_credentials() -> None:
    assert redact("GET https://bob:pa55@reg.example/v2/ failed") == "GET https://***@reg.example/v2/ failed"
    assert redact("token=abc123, password: hunter2") == "token=***, password: ***"
    assert redact("Authorization: Bearer eyJabc.def") == "Authorization: Bearer ***"
    assert redact("/var/lib/images/app.tar: short read") == "/var/lib/images/app.tar: short read"
