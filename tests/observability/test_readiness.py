"""One readiness rule (#22): `Reloader.status()`, `reloadd status`, /readyz and `reloadd_ready` always agree."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from reloadd import Reloader, load_config
from reloadd._ops._control import request
from reloadd._ops._services import services
from tests.daemon_config import write_config
from tests.waiting import until

from .support import Hook, http_get, sample, scrape, short_dir
from .test_metrics import Gated

pytestmark = pytest.mark.timeout(60)


async def verdicts(r: Reloader, base: str, sock: Path) -> dict[str, bool]:
    """Every place that says whether the node is ready."""
    return {
        "Reloader.status()": bool(r.status()["ready"]),
        "reloadd status": bool((await asyncio.to_thread(request, sock, "status"))["status"]["ready"]),
        "/readyz": (await http_get(base + "/readyz"))[0] == 200,
        "reloadd_ready": sample(await scrape(base), "reloadd_ready") == 1,
    }


def config(tmp_path: Path, consumers: list[dict], **settings: object) -> Path:
    sock = short_dir() / "ctl.sock"
    return write_config(tmp_path / "reloadd.toml", {
        "state_dir": str(tmp_path / "state"), "quiet": "50ms", "metrics_listen": "127.0.0.1:0",
        "control_socket": str(sock), **settings}, consumers)


async def test_not_ready_then_ready_everywhere_at_once(tmp_path: Path) -> None:
    watched = tmp_path / "watched"
    watched.mkdir()
    (watched / "present-at-start.txt").write_text("x")
    cfg = load_config(config(tmp_path, []))
    assert cfg.control_socket is not None
    gated = Gated(watched)
    r = Reloader(cfg, consumers=[gated])
    async with services(r) as svc:
        base = (svc.metrics_url or "").removesuffix("/metrics")
        async with r:
            await until(gated.entered.is_set, what="the initial pass under way")
            assert set((await verdicts(r, base, cfg.control_socket)).values()) == {False}
            gated.gate.set()
            await r.wait_idle(10)
            assert set((await verdicts(r, base, cfg.control_socket)).values()) == {True}


async def test_a_stuck_path_makes_every_view_unready(tmp_path: Path) -> None:
    hook = Hook.make(tmp_path / "hook")
    watched = tmp_path / "watched"
    watched.mkdir()
    hook.fail(1, "containerd is down")
    (watched / "stuck.tar").write_text("x")
    cfg = load_config(config(tmp_path, [{"name": "hook", "plugin": "exec", "paths": [str(watched)],
                                         "options": {"command": hook.command}}], ready_max_age="4s"))
    assert cfg.control_socket is not None
    r = Reloader(cfg)
    async with services(r) as svc, r:
        base = (svc.metrics_url or "").removesuffix("/metrics")
        await until(lambda: r.status()["consumers"]["hook"]["failing"] != [], what="the path failing")
        # Failing but not yet stuck: a path waiting for a retry keeps no view unready (the old status said otherwise).
        views = await verdicts(r, base, cfg.control_socket)
        assert set(views.values()) == {True}, views
        await until(lambda: not r.status()["ready"], what="stuck past ready_max_age")
        views = await verdicts(r, base, cfg.control_socket)
        assert set(views.values()) == {False}, views
        assert any("a path has waited" in p for p in r.status()["ready_problems"])
        hook.succeed()
        await r.wait_idle(15)
        assert set((await verdicts(r, base, cfg.control_socket)).values()) == {True}
