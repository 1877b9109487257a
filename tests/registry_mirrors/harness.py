"""A started Reloader running the registry-mirrors plugin from its entry point, with a batch log."""

from __future__ import annotations

import asyncio
import contextlib
import tomllib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reloadd import Batch, Reloader, parse_config

HOST = "registry.example.com"
WAIT = 15.0


@dataclass
class Running:
    """A started reloader with the registry-mirrors consumer and a batch log."""

    reloader: Reloader
    consumer: Any
    main: Path
    conf_d: Path
    hosts: Path
    batches: list[Batch] = field(default_factory=list)
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    sentinels: int = 0

    def batches_for(self, path: Path) -> list[Batch]:
        return [b for b in self.batches if path in b.paths]

    async def wait_for(self, pred: Callable[[], bool]) -> None:
        async with asyncio.timeout(WAIT), self.cond:
            await self.cond.wait_for(pred)

    async def wait_path(self, path: Path, count: int = 1) -> None:
        await self.wait_for(lambda: len(self.batches_for(path)) >= count)

    async def settle(self) -> None:
        """Change the main file and wait for it: everything saved before has been handed over."""
        self.sentinels += 1
        self.main.write_text(f"# sentinel {self.sentinels}\n")
        await self.wait_path(self.main, self.sentinels)
        await self.reloader.wait_idle(15)

    def mirrors(self, host: str = HOST) -> list[str] | None:
        """The mirror URLs in ``hosts_dir/<host>/hosts.toml`` in order, ``None`` when absent."""
        path = self.hosts / host / "hosts.toml"
        if not path.exists():
            return None
        return list(tomllib.loads(path.read_text()).get("host", {}))


@contextlib.asynccontextmanager
async def running_reloader(tmp_path: Path, *, settings: dict[str, Any] | None = None, drift: str = "correct",
                           **options: Any) -> AsyncIterator[Running]:
    etc = tmp_path / "etc"
    conf_d = etc / "registries.conf.d"
    conf_d.mkdir(parents=True)
    main = etc / "registries.conf"
    hosts = tmp_path / "certs.d"
    opts: dict[str, Any] = {
        "registries_conf": str(main),
        "registries_conf_d": str(conf_d),
        "hosts_dir": str(hosts),
        "certs_dirs": [],
        "containerd_config": "",
        **options,
    }
    cfg = parse_config(
        {
            "reloadd": {"state_dir": str(tmp_path / "state"), "quiet": "100ms", "max_delay": "2s",
                        **(settings or {})},
            "consumer": [{"name": "mirrors", "plugin": "registry-mirrors", "drift": drift, "options": opts}],
        }
    )
    async with Reloader(cfg) as r:
        consumer = r.engine.slots["mirrors"].consumer
        run = Running(r, consumer, main, conf_d, hosts)
        real_handle = consumer.handle

        async def counting_handle(batch: Batch) -> Any:
            results = await real_handle(batch)
            async with run.cond:
                run.batches.append(batch)
                run.cond.notify_all()
            return results

        consumer.handle = counting_handle  # type: ignore[method-assign]  # log batches of the live consumer
        await r.wait_idle(15)
        yield run


async def sh(*argv: str, cwd: Path | None = None) -> None:
    proc = await asyncio.create_subprocess_exec(*argv, cwd=cwd)
    assert await proc.wait() == 0, argv
