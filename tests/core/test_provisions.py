"""``Providing``: what one consumer's files provide reaches the other consumers of the same reloadd through
``ConsumerContext.provided``; a consumer that provides nothing, or a provider that breaks, changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reloadd import Providing, Provision, ProvisionState, Reloader

from ..conftest import Recorder, config_for

pytestmark = pytest.mark.timeout(60)


class Images(Recorder):
    def __init__(self, roots: list[Path], entries: list[Provision], **attrs: Any) -> None:
        super().__init__(roots, **attrs)
        self.entries = entries

    def provisions(self, kind: str) -> list[Provision]:
        return self.entries if kind == "image" else []


class Broken(Recorder):
    def provisions(self, kind: str) -> list[Provision]:
        raise RuntimeError("plugin bug")


async def test_a_consumer_reads_what_the_others_provide(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    roots = [tmp_path / n for n in ("images", "manifests", "other")]
    for root in roots:
        root.mkdir()
    tar = roots[0] / "web.tar"
    failed = Provision("image", "registry.local/web:1.4", tar, ProvisionState.FAILED, "import failed: truncated",
                       "images/web.tar")
    images = Images([roots[0]], [failed], name="images")
    manifests = Recorder([roots[1]], name="manifests")
    broken = Broken([roots[2]], name="broken")
    assert isinstance(images, Providing) and not isinstance(manifests, Providing)
    assert manifests.ctx.provided("image") == ()  # not started: nobody provides anything
    async with Reloader(config_for(tmp_path), consumers=[images, manifests, broken]) as r:
        await r.wait_idle(10)
        (got,) = manifests.ctx.provided("image")
        assert got.consumer == "images" and got.path == tar and got.state is ProvisionState.FAILED
        assert got.line() == "image registry.local/web:1.4 is in images/web.tar, import failed: truncated"
        assert manifests.ctx.provided("secret") == ()
        assert images.ctx.provided("image") == ()  # its own entries are not its answer
        assert "Failed to read what broken provides: plugin bug" in caplog.text
    assert Provision("image", "x/y:1", tar, ProvisionState.PENDING).line() == f"image x/y:1 is in {tar}, pending"
