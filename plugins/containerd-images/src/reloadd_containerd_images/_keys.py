"""Trusted public keys (``trusted_keys``) and offline signature checks over a SHA-256 digest.

Signatures are the bytes ``cosign sign-blob --key`` writes (and ``openssl dgst -sha256 -sign``):
ECDSA (P-256, P-384) and RSA (PKCS#1 v1.5 or PSS) over the SHA-256 of the file as shipped, so a
multi-GB archive is hashed once, streaming, and checked with ``Prehashed``. Pure Ed25519 signs the
message itself, not a digest: it is checked over the bytes, which bounds the files it can cover
(:data:`ED25519_LIMIT`).

Key IDs are cosign's bundle hint: base64 of the SHA-256 of the key's SubjectPublicKeyInfo DER,
shown as ``SHA256:<id>``.
"""

from __future__ import annotations

import base64
import glob
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed

__all__ = ["ED25519_LIMIT", "Keyring", "TrustedKey", "load_keys"]

ED25519_LIMIT = 256 << 20
"""Largest file an Ed25519 key can vouch for: pure Ed25519 needs the whole message in memory."""
_CURVES = (ec.SECP256R1, ec.SECP384R1)
_PublicKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey | rsa.RSAPublicKey


class KeyFileError(ValueError):
    """A key file that cannot be used (unreadable, not a PEM public key, unsupported type)."""


@dataclass(frozen=True)
class TrustedKey:
    """One configured public key.

    Attributes:
        id: cosign's hint: base64(SHA-256(SPKI DER)).
        path: The PEM file it was read from.
        key: The key.
    """

    id: str
    path: Path
    key: _PublicKey

    @property
    def shown(self) -> str:
        """``SHA256:<id>``, as messages and labels show it."""
        return f"SHA256:{self.id}"

    @property
    def needs_message(self) -> bool:
        """Whether the key checks the message itself (Ed25519), not its digest."""
        return isinstance(self.key, ed25519.Ed25519PublicKey)

    def verifies(self, signature: bytes, digest: bytes, message: Callable[[], bytes] | None = None) -> bool:
        """Whether ``signature`` is this key's over the file of SHA-256 ``digest``.

        Args:
            signature: DER (ECDSA), raw (RSA, Ed25519) signature bytes.
            digest: The file's SHA-256 (32 bytes).
            message: Reads the file's bytes, for Ed25519 (``None``: an Ed25519 key verifies nothing).
        """
        k = self.key
        try:
            if isinstance(k, ec.EllipticCurvePublicKey):
                k.verify(signature, digest, ec.ECDSA(Prehashed(hashes.SHA256())))
            elif isinstance(k, rsa.RSAPublicKey):
                try:
                    k.verify(signature, digest, padding.PKCS1v15(), Prehashed(hashes.SHA256()))
                except InvalidSignature:
                    pss = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.AUTO)
                    k.verify(signature, digest, pss, Prehashed(hashes.SHA256()))
            else:
                if message is None:
                    return False
                k.verify(signature, message())
        except (InvalidSignature, ValueError):
            return False
        return True


def key_id(key: _PublicKey) -> str:
    """cosign's key hint: base64 of the SHA-256 of the SubjectPublicKeyInfo DER."""
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def read_key(path: Path) -> TrustedKey:
    """Load one PEM ``PUBLIC KEY``.

    Raises:
        KeyFileError: unreadable, not a public key, or a type or curve not supported.
    """
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise KeyFileError(f"{path} is not a PEM public key: {exc}") from exc
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, _CURVES):
            raise KeyFileError(f"{path}: ECDSA curve {key.curve.name} is not supported (P-256 or P-384)")
    elif isinstance(key, rsa.RSAPublicKey):
        if key.key_size < 2048:
            raise KeyFileError(f"{path}: RSA key of {key.key_size} bits is too small (2048 or more)")
    elif not isinstance(key, ed25519.Ed25519PublicKey):
        raise KeyFileError(f"{path}: {type(key).__name__} keys are not supported (ECDSA P-256/P-384, Ed25519, RSA)")
    return TrustedKey(key_id(key), path, key)


@dataclass(frozen=True)
class Keyring:
    """The keys a consumer trusts now (re-read at start and on every forced pass: a SIGHUP)."""

    keys: tuple[TrustedKey, ...] = ()

    @property
    def shown(self) -> str:
        """``SHA256:a, SHA256:b`` (or ``none``), for refusals."""
        return ", ".join(k.shown for k in self.keys) or "none configured"

    def by_hint(self, hint: str) -> TrustedKey | None:
        """The configured key whose ID is ``hint`` (a bundle's unauthenticated hint only picks, never adds)."""
        return next((k for k in self.keys if k.id == hint), None)


def load_keys(patterns: Sequence[str], base: Path | None) -> Keyring:
    """Read every key the ``trusted_keys`` globs name (relative ones under ``base``).

    A glob that matches nothing is an error too: a key directory emptied by mistake must not
    silently leave the consumer with no key.

    Raises:
        KeyFileError: naming the file (or the pattern that matched nothing).
    """
    keys: dict[str, TrustedKey] = {}
    for pattern in patterns:
        p = Path(pattern).expanduser()
        if not p.is_absolute() and base is not None:
            p = base / p
        if glob.has_magic(str(p)):
            found = sorted(Path(f) for f in glob.glob(str(p)))
            if not found:
                raise KeyFileError(f"{pattern!r} matches no key file")
        else:
            found = [p]
        for f in found:
            k = read_key(f)
            keys.setdefault(k.id, k)
    return Keyring(tuple(keys.values()))
