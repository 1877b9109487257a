"""Evidence judged without containerd: key types, signature encodings, bundles, checksum files, key config."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest
from reloadd_containerd_images import create
from reloadd_containerd_images._evidence import Refusal, judge
from reloadd_containerd_images._keys import load_keys

from reloadd import ConfigError, ConsumerContext
from tests.containerd_images._signing import Key, bundle, make_key, sha256sum_line

pytestmark = pytest.mark.timeout(60)


def _judge(path: Path, *keys: Key):  # type: ignore[no-untyped-def]
    ring = load_keys([str(k.public) for k in keys], None)
    data = path.read_bytes()
    return judge(path, ring, hashlib.sha256(data).hexdigest(), len(data))


@pytest.mark.parametrize("kind", ["p256", "p384", "ed25519", "rsa"])
@pytest.mark.parametrize("b64", [True, False])
def test_detached_signature_of_each_key_type(tmp_path: Path, kind: str, b64: bool) -> None:
    key, other = make_key(tmp_path / "k", "signer", kind), make_key(tmp_path / "k", "other")
    f = tmp_path / "web.tar.zst"
    f.write_bytes(b"\x28\xb5\x2f\xfd compressed bytes as shipped" * 1000)
    key.sig_file(f, b64=b64)
    v = _judge(f, other, key)
    assert v.verified and v.key is not None and v.key.id == key.id and v.via == "web.tar.zst.sig"
    assert v.key.shown == f"SHA256:{key.id}"

    f.write_bytes(f.read_bytes()[:-1] + b"!")  # one byte changed
    v = _judge(f, other, key)
    assert v.refusal is Refusal.BAD_SIGNATURE and v.why == "signature does not verify with any trusted key"


def test_wrong_key_and_missing_signature(tmp_path: Path) -> None:
    key, other = make_key(tmp_path / "k", "a"), make_key(tmp_path / "k", "b")
    f = tmp_path / "web.tar"
    f.write_bytes(b"archive")
    v = _judge(f, key)
    assert v.refusal is Refusal.NO_SIGNATURE and v.missing and "web.tar.sig" in v.why
    key.sig_file(f)
    assert _judge(f, other).refusal is Refusal.BAD_SIGNATURE


def test_bundle_hint_picks_among_configured_keys_only(tmp_path: Path) -> None:
    key, other = make_key(tmp_path / "k", "a"), make_key(tmp_path / "k", "b")
    f = tmp_path / "web.tar"
    f.write_bytes(b"archive bytes")
    bundle(key, f, digest_of=b"something else entirely")  # messageDigest is never trusted: recomputed
    v = _judge(f, other, key)
    assert v.verified and v.key is not None and v.key.id == key.id and v.via == "web.tar.sigstore.json"

    bundle(key, f, hint=other.id)  # the hint picks `other`, which did not sign: refused, no fallback
    assert _judge(f, other, key).refusal is Refusal.BAD_SIGNATURE

    bundle(key, f)  # signed and hinted by a key that is not configured
    v = _judge(f, other)
    assert v.refusal is Refusal.UNTRUSTED_KEY and f"hint SHA256:{key.id}" in v.why


def test_signed_checksum_file(tmp_path: Path) -> None:
    key = make_key(tmp_path / "k", "a")
    d = tmp_path / "images"
    d.mkdir()
    files = [d / f"img{i}.tar" for i in range(3)]
    for i, f in enumerate(files):
        f.write_bytes(b"archive %d" % i * 100)
    sums = d / "sha256sum-amd64.txt"
    sums.write_text("".join(sha256sum_line(f) for f in files))
    for f in files:  # unsigned: lists them, vouches for none
        v = _judge(f, key)
        assert v.refusal is Refusal.NO_SIGNATURE and "sha256sum-amd64.txt lists it but is not signed" in v.why
    key.sig_file(sums)
    for f in files:
        v = _judge(f, key)
        assert v.verified and v.via == "sha256sum-amd64.txt (sha256sum-amd64.txt.sig)"
    files[1].write_bytes(files[1].read_bytes()[:50])  # a truncated copy
    v = _judge(files[1], key)
    assert v.refusal is Refusal.DIGEST_MISMATCH and "sha256sum-amd64.txt" == v.via

    sums.write_text(sums.read_text() + "# edited after signing\n")
    v = _judge(files[0], key)
    assert v.refusal is Refusal.BAD_SIGNATURE and v.why.startswith("checksum file: signature does not verify")


def _ctx(tmp_path: Path, **options: object) -> ConsumerContext:
    return ConsumerContext(name="images", paths=(tmp_path,), options={"address": "/nonexistent.sock", **options},
                           state_dir=tmp_path, logger=logging.getLogger("t"))


def test_key_config_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pub"
    bad.write_text("-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----\n")
    with pytest.raises(ConfigError, match=r"trusted_keys.*bad\.pub"):
        create(_ctx(tmp_path, verify="require", trusted_keys=[str(bad)]))
    with pytest.raises(ConfigError, match=r"cannot read .*missing\.pub"):
        create(_ctx(tmp_path, verify="warn", trusted_keys=[str(tmp_path / "missing.pub")]))
    with pytest.raises(ConfigError, match=r"matches no key file"):
        create(_ctx(tmp_path, verify="warn", trusted_keys=[str(tmp_path / "none" / "*.pub")]))
    with pytest.raises(ConfigError, match=r"needs 'trusted_keys'"):
        create(_ctx(tmp_path, verify="require"))
    with pytest.raises(ConfigError, match=r"verify"):
        create(_ctx(tmp_path, verify="yes"))
    key = make_key(tmp_path / "keys", "a")
    c = create(_ctx(tmp_path, verify="require", trusted_keys=[str(tmp_path / "keys" / "*.pub")]))
    assert c.status_note == f"verify=require, keys SHA256:{key.id}"  # type: ignore[attr-defined]
