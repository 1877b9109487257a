"""``.txt`` image lists pulled through CRI from a local docker-registry."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from reloadd import Ack, ChangeKind, Reject, Retry
from tests.containerd_images._helpers import Harness
from tests.infra import Containerd, ImageSpec, Registry, local_registry, push_image, write_oci_archive

pytestmark = pytest.mark.timeout(180)

PIN = "io.cri-containerd.pinned"


def _manifest_gets(reg: Registry, repo: str) -> int:
    return sum(1 for r in reg.requests() if r.method in ("GET", "HEAD") and r.path.startswith(f"/v2/{repo}/manifests/"))


async def _push(
    reg: Registry, tmp_path: Path, repo: str, seed: str, platforms: tuple[str, ...] = ("linux/amd64",)
) -> None:
    src = tmp_path / f"{seed}.tar"
    write_oci_archive(src, [ImageSpec(f"example.com/{repo}:v1", seed=seed, platforms=platforms)])
    await push_image(src, f"{reg.host}/{repo}:v1")


async def test_list_pulls_missing_images_once(ctd: Containerd, harness: Callable[..., Harness], tmp_path: Path) -> None:
    async with local_registry(tmp_path) as reg:
        await _push(reg, tmp_path, "library/alpha", "alpha")
        await _push(reg, tmp_path, "team/beta", "beta", ("linux/amd64", "linux/arm64"))
        h = harness()
        lst = h.root / "prepull.txt"
        lst.write_text(f"# images for the node\n\n{reg.host}/library/alpha:v1\n  {reg.host}/team/beta:v1  # multi\n")
        res = await h.handle(lst)
        assert isinstance(res[lst], Ack), res
        for ref in (f"{reg.host}/library/alpha:v1", f"{reg.host}/team/beta:v1"):
            assert await ctd.cri_image_status(ref) is not None
            img = await h.consumer.client.get_image(ref)
            assert img is not None and img.labels[PIN] == "pinned"
        assert h.consumer.stats["images_pulled"] == 2
        before = _manifest_gets(reg, "library/alpha")
        assert before >= 1

        # Handed over again (forced resync): present images are not pulled again.
        res = await h.handle(lst)
        assert isinstance(res[lst], Ack)
        assert _manifest_gets(reg, "library/alpha") == before
        assert h.consumer.stats["images_pulled"] == 2

        res = await h.handle(lst, kind=ChangeKind.DELETED)
        assert isinstance(res[lst], Ack)
        img = await h.consumer.client.get_image(f"{reg.host}/library/alpha:v1")
        assert img is not None and PIN not in img.labels


async def test_list_with_garbage_lines_and_missing_image(
    ctd: Containerd, harness: Callable[..., Harness], tmp_path: Path
) -> None:
    async with local_registry(tmp_path) as reg:
        await _push(reg, tmp_path, "library/good", "good")
        h = harness()
        lst = h.root / "mixed.txt"
        lst.write_text(f"{reg.host}/library/good:v1\nNot An Image!!\n\n{reg.host}/library/absent:v1\nUPPER/case:x\n")
        res = await h.handle(lst)
        r = res[lst]
        assert isinstance(r, Reject), r
        assert str(lst) in r.error
        assert "line 2: 'Not An Image!!' is not a valid image reference" in r.error
        assert "line 5:" in r.error
        assert "line 4:" in r.error and "absent" in r.error
        assert await ctd.cri_image_status(f"{reg.host}/library/good:v1") is not None

        # Without garbage, a missing image is a transient failure (retried), the rest still pulled.
        lst2 = h.root / "retry.txt"
        lst2.write_text(f"{reg.host}/library/absent:v1\n{reg.host}/library/good:v1\n")
        res = await h.handle(lst2)
        assert isinstance(res[lst2], Retry)
        assert "absent" in res[lst2].error
