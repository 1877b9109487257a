"""An embedding app can run the ops services (metrics, health, control socket), or is told it does not."""

from __future__ import annotations

import asyncio
import logging
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import reloadd
from reloadd import Reloader, parse_config
from reloadd._ops._control import request

from .support import short_dir

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def sdir() -> Iterator[Path]:
    d = short_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _config(d: Path) -> reloadd.Config:
    return parse_config({"reloadd": {"state_dir": str(d / "state"), "metrics_listen": "127.0.0.1:0",
                                     "control_socket": str(d / "ctl.sock"), "quiet": "100ms"}})


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.read().decode()


async def _check_served(r: Reloader, d: Path) -> None:
    assert r.ops is not None and r.ops.metrics_url is not None
    status, body = await asyncio.to_thread(_get, r.ops.metrics_url)
    assert status == 200 and "reloadd" in body
    reply = await asyncio.to_thread(request, d / "ctl.sock", "status")
    assert reply["ok"] is True
    reply = await asyncio.to_thread(request, d / "ctl.sock", "reload")
    assert reply["ok"] is True


async def test_serve_ops_starts_and_stops_the_services(sdir: Path, caplog) -> None:
    async with Reloader(_config(sdir), serve_ops=True) as r:
        await r.wait_idle(10)
        await _check_served(r, sdir)
        url = r.ops.metrics_url if r.ops else None
    assert r.ops is None
    assert not (sdir / "ctl.sock").exists()
    with pytest.raises(OSError):
        await asyncio.to_thread(_get, url)
    assert "not served" not in caplog.text


async def test_ops_services_context_manager(sdir: Path) -> None:
    r = Reloader(_config(sdir))
    async with reloadd.ops_services(r) as svc, r:
        assert r.ops is svc
        await r.wait_idle(10)
        await _check_served(r, sdir)


async def test_configured_but_not_served_warns(sdir: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING, "reloadd"):
        async with Reloader(_config(sdir)) as r:
            await r.wait_idle(10)
    warnings = [m for m in caplog.records if "not served" in m.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "serve_ops=True" in warnings[0].getMessage()
