"""Keys and signatures made by the ``openssl`` CLI, as a release engineer without cosign makes them.

``openssl dgst -sha256 -sign`` with an EC key writes ECDSA-with-SHA256 in ASN.1 DER: the very bytes
``cosign sign-blob --key`` writes (base64'd in its ``.sig``). Ed25519 is signed with ``pkeyutl -rawin``
(pure Ed25519, as cosign signs without a transparency log).
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization

__all__ = ["Key", "bundle", "make_key", "sha256sum_line"]


def _openssl(*args: str) -> bytes:
    return subprocess.run(["openssl", *args], check=True, capture_output=True).stdout


@dataclass(frozen=True)
class Key:
    """A key pair on disk: ``private`` (PEM) and ``public`` (PEM ``PUBLIC KEY``)."""

    private: Path
    public: Path
    kind: str

    @property
    def id(self) -> str:
        """cosign's hint: base64(SHA-256(SPKI DER)), computed here independently of the plugin."""
        der = _openssl("pkey", "-pubin", "-in", str(self.public), "-outform", "DER")
        return base64.b64encode(hashlib.sha256(der).digest()).decode()

    def sign(self, path: Path) -> bytes:
        """The raw signature (DER for ECDSA) over ``path``'s bytes as they are."""
        if self.kind == "ed25519":
            return _openssl("pkeyutl", "-sign", "-inkey", str(self.private), "-rawin", "-in", str(path))
        return _openssl("dgst", "-sha256", "-sign", str(self.private), str(path))

    def sig_file(self, path: Path, *, b64: bool = True) -> Path:
        """Write ``<path>.sig`` (cosign's base64 by default, raw DER with ``b64=False``)."""
        sig = self.sign(path)
        out = path.with_name(path.name + ".sig")
        out.write_bytes(base64.b64encode(sig) if b64 else sig)
        return out


def make_key(directory: Path, name: str, kind: str = "p256") -> Key:
    """A new key pair: ``p256``, ``p384``, ``ed25519`` or ``rsa``."""
    directory.mkdir(parents=True, exist_ok=True)
    priv, pub = directory / f"{name}.key", directory / f"{name}.pub"
    if kind in ("p256", "p384"):
        curve = "prime256v1" if kind == "p256" else "secp384r1"
        _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", f"ec_paramgen_curve:{curve}", "-out", str(priv))
    elif kind == "ed25519":
        _openssl("genpkey", "-algorithm", "ed25519", "-out", str(priv))
    else:
        _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(priv))
    _openssl("pkey", "-in", str(priv), "-pubout", "-out", str(pub))
    assert serialization.load_pem_public_key(pub.read_bytes()) is not None
    return Key(priv, pub, kind)


def bundle(key: Key, path: Path, *, hint: str | None = None, digest_of: bytes | None = None) -> Path:
    """Write ``<path>.sigstore.json`` as ``cosign sign-blob --bundle`` (v3, key, no tlog) does.

    Args:
        hint: The ``publicKey.hint`` (default: the signing key's ID).
        digest_of: Bytes whose SHA-256 goes in ``messageDigest`` (default: the file's), to show it is ignored.
    """
    data = path.read_bytes() if digest_of is None else digest_of
    digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
    doc = {
        "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
        "verificationMaterial": {"publicKey": {"hint": key.id if hint is None else hint}},
        "messageSignature": {
            "messageDigest": {"algorithm": "SHA2_256", "digest": digest},
            "signature": base64.b64encode(key.sign(path)).decode(),
        },
    }
    out = path.with_name(path.name + ".sigstore.json")
    out.write_text(json.dumps(doc))
    return out


def sha256sum_line(path: Path, prefix: str = "dist/artifacts/") -> str:
    """One ``sha256sum`` line for ``path`` (``<hex>  <prefix><name>``, as k3s/rke2 ship them)."""
    return f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {prefix}{path.name}\n"
