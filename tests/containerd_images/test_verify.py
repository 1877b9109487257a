"""``verify``: only what a trusted key signed reaches containerd (issue #60), on each containerd release.

Keys and signatures are made by the ``openssl`` CLI (``_signing``). One containerd per release serves
the whole module; each test imports into a namespace of its own, so "nothing left" is checked on a
namespace nothing else writes to.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from reloadd_containerd_images import ContainerdImagesConsumer
from reloadd_containerd_images._policy import KEY_LABEL, VIA_LABEL

import reloadd
from reloadd import Ack, Batch, Change, ChangeKind, Reason, Reject, Retry
from reloadd._ops._metrics import ReloaderCollector, render
from tests.containerd_images._helpers import Harness, dump, sync_gc
from tests.containerd_images._signing import Key, bundle, make_key, sha256sum_line
from tests.infra import (
    Containerd,
    ImageSpec,
    local_registry,
    private_containerd,
    push_image,
    releases_under_test,
    write_oci_archive,
)
from tests.waiting import until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=releases_under_test())
async def mctd(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Containerd]:
    async with private_containerd(tmp_path_factory.mktemp("ctd"), release=str(request.param)) as c:
        yield c
        panics = c.panics()
    assert not panics, "containerd panicked:\n" + "\n".join(panics[:20])


class Clock:
    """The policy's clock, moved by the test (the evidence wait is judged on it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Key]:
    return {n: make_key(tmp_path / "keys", n) for n in ("a", "b")}


@pytest_asyncio.fixture(loop_scope="module")
async def make(mctd: Containerd, tmp_path: Path) -> AsyncIterator[Callable[..., Harness]]:
    made: list[Harness] = []
    root = tmp_path / "images"
    root.mkdir()

    def build(overlap: bool = False, **options: Any) -> Harness:
        options.setdefault("namespace", f"v{uuid.uuid4().hex[:8]}")
        state = tmp_path / f"state{len(made)}"
        state.mkdir()
        h = Harness(mctd, root, state, options)
        h.consumer.policy.clock = Clock()
        if overlap:  # judged while imported, as archives from 64 MiB on are (see _policy.OVERLAP_FROM)
            h.consumer.policy.overlap_from = 0
        made.append(h)
        return h

    yield build
    for h in made:
        await h.consumer.close()


def _archive(path: Path, name: str, seed: str) -> Path:
    write_oci_archive(path, [ImageSpec(name, seed=seed)])
    return path


def _clock(h: Harness) -> Clock:
    clock = h.consumer.policy.clock
    assert isinstance(clock, Clock)
    return clock


def _refused(h: Harness) -> dict[str, float]:
    return {k: v for k, v in h.consumer.stats.items() if k.startswith("images_refused_total{") and v}


async def _nothing_left(h: Harness) -> None:
    """No image, no blob, no snapshot, no ingest and no lease in the consumer's namespace."""
    await sync_gc(h.ctd.address)
    d = await dump(h.ctd.address, h.consumer.settings.namespace)
    assert d["images"] == [] and d["content"] == [] and d["snapshots"] == [], d
    assert await h.consumer.client.list_leases() == []
    assert await h.consumer.client.list_ingests() == []


@pytest.mark.parametrize("overlap", [False, True], ids=["checked-first", "checked-while-imported"])
async def test_signed_archive_imported_with_provenance(
    make: Callable[..., Harness], keys: dict[str, Key], overlap: bool
) -> None:
    a = keys["a"]
    h = make(overlap, verify="require", trusted_keys=[str(a.public)])
    web = _archive(h.root / "web.tar", "example.com/web:v1", "web")
    a.sig_file(web)
    res = await h.handle(web)
    assert isinstance(res[web], Ack), res
    img = await h.consumer.client.get_image("example.com/web:v1")
    assert img is not None and img.labels[KEY_LABEL] == f"SHA256:{a.id}" and img.labels[VIA_LABEL] == "web.tar.sig"
    assert res[web].data["verified"]["key"] == f"SHA256:{a.id}"
    out = await h.ctd.ctr("images", "ls", namespace=h.consumer.settings.namespace)
    assert f"{KEY_LABEL}=SHA256:{a.id}" in out, out  # what an operator sees


@pytest.mark.parametrize("overlap", [False, True], ids=["checked-first", "checked-while-imported"])
async def test_flipped_byte_or_wrong_key_refused_nothing_left(
    make: Callable[..., Harness], keys: dict[str, Key], overlap: bool
) -> None:
    a, b = keys["a"], keys["b"]
    h = make(overlap, verify="require", trusted_keys=[str(a.public)])
    web = _archive(h.root / "web.tar", "example.com/web:v1", "web")
    a.sig_file(web)
    raw = bytearray(web.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    web.write_bytes(bytes(raw))

    plan = await h.consumer.plan(Batch("images", Reason.STARTUP, (Change(web, ChangeKind.ADDED, None, root=h.root),)))
    [entry] = plan[web]
    assert entry.is_invalid and entry.line.startswith("INVALID") and "REFUSED images/web.tar (sha256:" in entry.line

    res = await h.handle(web)
    assert isinstance(res[web], Reject), res
    err = res[web].error
    assert err.startswith("REFUSED images/web.tar (sha256:")
    assert f"signature does not verify with any trusted key (keys SHA256:{a.id}; checked web.tar.sig)" in err
    assert err.endswith("; nothing imported")
    await _nothing_left(h)

    b.sig_file(_archive(web, "example.com/web:v1", "web"))  # intact bytes, signed by a key not trusted
    res = await h.handle(web)
    assert isinstance(res[web], Reject) and "does not verify with any trusted key" in res[web].error
    await _nothing_left(h)
    assert _refused(h) == {"images_refused_total{reason=bad_signature}": 2}


async def test_require_waits_for_the_signature(make: Callable[..., Harness], keys: dict[str, Key]) -> None:
    a = keys["a"]
    h = make(verify="require", trusted_keys=[str(a.public)], verify_wait="30s")
    clock = _clock(h)
    web = _archive(h.root / "web.tar", "example.com/web:v1", "web")
    res = await h.handle(web)
    r = res[web]
    assert isinstance(r, Retry) and not r.failure and r.after == pytest.approx(30.0), r  # deferred, in status
    clock.now += 31
    res = await h.handle(web)
    assert isinstance(res[web], Reject) and "no signature found" in res[web].error, res
    await _nothing_left(h)

    # The signature arrives later: it hands the archive over again, which is imported.
    sig = a.sig_file(web)
    res = await h.handle(sig)
    assert isinstance(res[sig], Ack) and h.triggered == [web]
    res = await h.handle(web, reason=Reason.TRIGGER)
    assert isinstance(res[web], Ack), res
    assert await h.consumer.client.get_image("example.com/web:v1") is not None

    # Within the wait: the archive is deferred, its signature's arrival hands it over.
    api = _archive(h.root / "api.tar", "example.com/api:v1", "api")
    assert isinstance((await h.handle(api))[api], Retry)
    h.triggered.clear()
    await h.handle(a.sig_file(api))
    assert h.triggered == [api]
    assert isinstance((await h.handle(api))[api], Ack)

    # A changed archive needs a new signature.
    _archive(web, "example.com/web:v2", "web2")
    res = await h.handle(web)
    assert isinstance(res[web], Reject) and "does not verify" in res[web].error
    assert await h.consumer.client.get_image("example.com/web:v2") is None


async def test_warn_imports_unverified_with_the_same_words(
    make: Callable[..., Harness], keys: dict[str, Key], caplog: pytest.LogCaptureFixture
) -> None:
    h = make(verify="warn", trusted_keys=[str(keys["a"].public)], verify_wait="0s")
    web = _archive(h.root / "web.tar", "example.com/web:v1", "web")
    keys["b"].sig_file(web)
    plan = await h.consumer.plan(Batch("images", Reason.STARTUP, (Change(web, ChangeKind.ADDED, None, root=h.root),)))
    assert [c.action for c in plan[web]] == ["unverified", "import"], plan
    assert plan[web][0].detail["why"].startswith("UNVERIFIED images/web.tar (sha256:")
    with caplog.at_level(logging.WARNING, "reloadd.consumer.images"):
        res = await h.handle(web)
    assert isinstance(res[web], Ack), res
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert line.startswith("UNVERIFIED images/web.tar (sha256:") and "does not verify with any trusted key" in line
    assert line.endswith('imported anyway (verify = "warn")')
    img = await h.consumer.client.get_image("example.com/web:v1")
    assert img is not None and KEY_LABEL not in img.labels
    assert res[web].data["verified"]["unverified"].startswith("signature does not verify")

    # A copy an (unsigned) checksum file lists with another digest is refused under warn too: it is corrupt.
    short = _archive(h.root / "short.tar", "example.com/short:v1", "short")
    (h.root / "SHA256SUMS").write_text(sha256sum_line(short))
    short.write_bytes(short.read_bytes()[:-1024])
    res = await h.handle(short)
    assert isinstance(res[short], Reject) and res[short].error.startswith("REFUSED images/short.tar"), res
    assert "SHA256SUMS" in res[short].error and res[short].error.endswith("nothing imported")
    assert await h.consumer.client.get_image("example.com/short:v1") is None


async def test_signed_checksum_file_covers_three(make: Callable[..., Harness], keys: dict[str, Key]) -> None:
    a = keys["a"]
    h = make(verify="require", trusted_keys=[str(a.public)])
    tars = [_archive(h.root / f"img{i}.tar", f"example.com/img{i}:v1", f"img{i}") for i in range(3)]
    sums = h.root / "sha256sum-amd64.txt"
    sums.write_text("".join(sha256sum_line(t) for t in tars))
    sig = a.sig_file(sums)
    res = await h.handle(*tars, sums, sig)
    assert all(isinstance(r, Ack) for r in res.values()), res
    assert h.triggered == []  # the archives were in the same batch
    for i in range(3):
        img = await h.consumer.client.get_image(f"example.com/img{i}:v1")
        assert img is not None and img.labels[VIA_LABEL] == "sha256sum-amd64.txt (sha256sum-amd64.txt.sig)"

    short = h.root / "copy.tar"  # a truncated copy of img1, under the name the checksum file lists
    _archive(short, "example.com/img9:v1", "img9")
    sums.write_text(sums.read_text() + sha256sum_line(short))
    a.sig_file(sums)
    short.write_bytes(short.read_bytes()[:-2048])
    res = await h.handle(short)
    assert isinstance(res[short], Reject) and "lists it with sha256:" in res[short].error, res
    assert "checked sha256sum-amd64.txt" in res[short].error
    assert await h.consumer.client.get_image("example.com/img9:v1") is None
    assert _refused(h) == {"images_refused_total{reason=digest_mismatch}": 1}


@pytest.mark.parametrize("overlap", [False, True], ids=["checked-first", "checked-while-imported"])
async def test_bundle_hint_of_an_untrusted_key_refused(
    make: Callable[..., Harness], keys: dict[str, Key], overlap: bool
) -> None:
    a, b = keys["a"], keys["b"]
    h = make(overlap, verify="require", trusted_keys=[str(a.public)])
    web = _archive(h.root / "web.tar", "example.com/web:v1", "web")
    bundle(b, web)
    res = await h.handle(web)
    assert isinstance(res[web], Reject), res
    assert f"signed with a key that is not trusted (hint SHA256:{b.id})" in res[web].error
    await _nothing_left(h)
    bundle(a, web)
    res = await h.handle(web)
    assert isinstance(res[web], Ack), res
    img = await h.consumer.client.get_image("example.com/web:v1")
    assert img is not None and img.labels[VIA_LABEL] == "web.tar.sigstore.json"


async def test_key_rotation_on_reload(make: Callable[..., Harness], keys: dict[str, Key]) -> None:
    a, b = keys["a"], keys["b"]
    h = make(verify="require", trusted_keys=[str(a.public.parent / "*.pub")])
    old = _archive(h.root / "old.tar", "example.com/old:v1", "old")
    new = _archive(h.root / "new.tar", "example.com/new:v1", "new")
    a.sig_file(old)
    b.sig_file(new)
    res = await h.handle(old, new)
    assert all(isinstance(r, Ack) for r in res.values()), res

    a.public.unlink()  # the old key is retired; a SIGHUP's pass re-reads the keys
    later = _archive(h.root / "later.tar", "example.com/later:v1", "later")
    a.sig_file(later)
    res = await h.handle(later, new, reason=Reason.SIGNAL)
    assert isinstance(res[new], Ack), res
    assert isinstance(res[later], Reject) and f"(keys SHA256:{b.id}; checked later.tar.sig)" in res[later].error
    assert h.consumer.status_note == f"verify=require, keys SHA256:{b.id}"


async def test_list_unpinned_line_refused_pinned_pulled(
    make: Callable[..., Harness], keys: dict[str, Key], tmp_path: Path
) -> None:
    a = keys["a"]
    async with local_registry(tmp_path) as reg:
        built = {}
        for repo in ("team/pinned", "team/tagged"):
            src = tmp_path / f"{repo.replace('/', '-')}.tar"
            [built[repo]] = write_oci_archive(src, [ImageSpec(f"example.com/{repo}:v1", seed=repo)])
            await push_image(src, f"{reg.host}/{repo}:v1")
        h = make(verify="require", trusted_keys=[str(a.public)])
        pinned = f"{reg.host}/team/pinned@{built['team/pinned'].target.digest}"
        tagged = f"{reg.host}/team/tagged:v1"
        lst = h.root / "prepull.txt"
        lst.write_text(f"{tagged}\n{pinned}\n")
        a.sig_file(lst)
        res = await h.handle(lst)
        r = res[lst]
        assert isinstance(r, Reject), res
        assert r.error.startswith("REFUSED images/prepull.txt (sha256:") and f"line 1 {tagged}" in r.error
        assert await h.ctd.cri_image_status(pinned) is not None
        assert await h.ctd.cri_image_status(tagged) is None
        assert _refused(h) == {"images_refused_total{reason=unpinned}": 1}

        lst.write_text(f"{pinned}\n")  # changed after signing: refused whole
        res = await h.handle(lst)
        assert isinstance(res[lst], Reject) and "does not verify" in res[lst].error



async def test_through_the_engine_status_metric_and_late_signature(
    mctd: Containerd, keys: dict[str, Key], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The real engine: a deferred archive in status, imported when its signature lands; a refusal in status,
    in one WARNING line and in ``reloadd_images_refused_total``."""
    a, b = keys["a"], keys["b"]
    images = tmp_path / "images"
    images.mkdir()
    ns = f"v{uuid.uuid4().hex[:8]}"
    toml = tmp_path / "reloadd.toml"
    toml.write_text(f"""
[reloadd]
state_dir = "{tmp_path / "state"}"
quiet = "100ms"

[[consumer]]
name = "images"
plugin = "containerd-images"
paths = ["{images}"]
[consumer.options]
address = "{mctd.address}"
namespace = "{ns}"
verify = "require"
trusted_keys = ["{a.public}"]
verify_wait = "10m"
""")
    cfg = reloadd.load_config(toml)
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    async with reloadd.Reloader(cfg) as r:
        await r.wait_idle(60)
        c = r.engine.slots["images"].consumer
        assert isinstance(c, ContainerdImagesConsumer)
        _archive(incoming / "web.tar", "example.com/web:v1", "web").rename(images / "web.tar")

        def listed(kind: str, name: str) -> list[dict[str, Any]]:
            return [d for d in r.status()["consumers"]["images"].get(kind, []) if d["path"] == str(images / name)]

        await until(lambda: bool(listed("deferred", "web.tar")), what="web.tar deferred")
        assert "waiting for its signature" in listed("deferred", "web.tar")[0]["reason"]
        a.sig_file(images / "web.tar").rename(incoming / "web.tar.sig")  # written elsewhere, renamed in
        (incoming / "web.tar.sig").rename(images / "web.tar.sig")
        await r.wait_idle(60)  # the signature handed web.tar over again, at once: nothing waits any more
        img = await c.client.get_image("example.com/web:v1")
        assert img is not None and img.labels[KEY_LABEL] == f"SHA256:{a.id}"

        bad = _archive(incoming / "bad.tar", "example.com/bad:v1", "bad")
        b.sig_file(bad).rename(images / "bad.tar.sig")
        with caplog.at_level(logging.WARNING):
            bad.rename(images / "bad.tar")
            await until(lambda: bool(listed("rejected", "bad.tar")), what="bad.tar refused")
            await r.wait_idle(60)
        [rej] = listed("rejected", "bad.tar")
        assert rej["error"].startswith("REFUSED images/bad.tar (sha256:") and rej["error"].endswith("nothing imported")
        lines = [m for m in caplog.records if "REFUSED images/bad.tar" in m.getMessage()]
        assert [m.levelno for m in lines] == [logging.WARNING], [m.getMessage() for m in lines]
        assert await c.client.get_image("example.com/bad:v1") is None
        text = render(ReloaderCollector(r).collect()).decode()
        assert 'reloadd_images_refused_total{consumer="images",reason="bad_signature"} 1' in text, text
        assert 'reloadd_images_refused_total{consumer="images",reason="no_signature"} 0' in text
