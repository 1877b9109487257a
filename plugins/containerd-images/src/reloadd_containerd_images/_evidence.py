"""What vouches for an archive or a list, found beside it and judged with the trusted keys only.

Evidence accepted (all offline, all checked with a *configured* key, never one a file carries):

- ``<file>.sig``: cosign's detached blob signature (base64 of the DER, or the raw DER), over the
  file's exact bytes as shipped (a ``.tar.zst`` stays compressed);
- ``<file>.sigstore.json``: a Sigstore bundle (v0.1–v0.3) with a ``messageSignature``. The digest
  is recomputed from the file (the bundle's ``messageDigest`` is never trusted, as the spec says) and
  the ``publicKey.hint`` only picks among the configured keys: a hint naming no configured key is a
  refusal, not a key to add (the cosign GHSA-fx35-mq7g-6g98 trap);
- a ``sha256sum``-format checksum file in the same folder (``sha256sum-amd64.txt``, ``SHA256SUMS``, as
  k3s and rke2 ship), itself signed the same way, listing the file's SHA-256. An unsigned one never
  verifies anything, but a file it lists with another digest (a truncated copy) is refused.

Everything here blocks (it reads files): the consumer runs it in a worker thread.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ._keys import ED25519_LIMIT, Keyring, TrustedKey

__all__ = [
    "EVIDENCE_SUFFIXES", "Refusal", "Verdict", "covered_by", "evidence_present", "is_checksum_file", "is_evidence",
    "judge", "sha256_fd", "sha256_file",
]

SIG_SUFFIX = ".sig"
BUNDLE_SUFFIX = ".sigstore.json"
EVIDENCE_SUFFIXES = (SIG_SUFFIX, BUNDLE_SUFFIX)
EVIDENCE_LIMIT = 1 << 20
"""Largest signature, bundle or checksum file read, in bytes."""
_CHUNK = 4 << 20
_SUM_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")


class Refusal(enum.StrEnum):
    """Why a file was refused: the ``reason`` label of ``reloadd_images_refused_total``."""

    NO_SIGNATURE = "no_signature"
    """Nothing beside the file vouches for it (after the wait)."""

    BAD_SIGNATURE = "bad_signature"
    """A signature is there but no trusted key verifies it over these bytes."""

    UNTRUSTED_KEY = "untrusted_key"
    """A bundle names (hint) a key that is not configured."""

    DIGEST_MISMATCH = "digest_mismatch"
    """A checksum file lists the file with another SHA-256 (a truncated or corrupted copy)."""

    UNPINNED = "unpinned"
    """A list line names an image by tag, not by digest (``require`` only: a tag can move)."""

    UNSUPPORTED = "unsupported"
    """Evidence of a kind not accepted (keyless or DSSE bundle, unreadable signature)."""


@dataclass(frozen=True)
class Verdict:
    """What the evidence says about one file.

    Attributes:
        digest: The file's SHA-256, hex.
        key: The trusted key that verified it, or ``None``.
        via: The evidence file that did (``web.tar.sig``, ``sha256sum-amd64.txt``), or the one that
            refused it.
        refusal: Why it is refused, when ``key`` is ``None``.
        why: The refusal in words (``signature does not verify with any trusted key``).
        notes: Evidence that did not count (an unsigned checksum file that lists it), for messages.
    """

    digest: str
    key: TrustedKey | None = None
    via: str = ""
    refusal: Refusal | None = None
    why: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def verified(self) -> bool:
        """Whether a trusted key vouches for the file."""
        return self.key is not None

    @property
    def missing(self) -> bool:
        """Whether nothing was found at all (the file may wait for its evidence)."""
        return self.refusal is Refusal.NO_SIGNATURE


def is_evidence(path: Path) -> bool:
    """Whether ``path`` is a signature or a bundle (``.sig``, ``.sigstore.json``)."""
    return path.name.endswith(EVIDENCE_SUFFIXES)


def is_checksum_file(path: Path) -> bool:
    """Whether ``path`` is a checksum file by name: ``sha256sum*`` or ``SHA256SUMS*`` (never an image list)."""
    return path.name.lower().startswith("sha256sum") and not is_evidence(path)


def signed_file(evidence: Path) -> Path:
    """The file a ``.sig`` or ``.sigstore.json`` is about."""
    name = evidence.name
    for suffix in EVIDENCE_SUFFIXES:
        if name.endswith(suffix):
            return evidence.with_name(name[: -len(suffix)])
    return evidence


def covered_by(evidence: Path) -> list[Path]:
    """The files (existing or not) whose verdict ``evidence`` can change: what it signs, what a checksum file lists."""
    target = signed_file(evidence)
    if not is_checksum_file(target):
        return [target]
    return [target.with_name(name) for name in _read_sums(target)]


def sha256_file(path: Path) -> tuple[str, int]:
    """SHA-256 (hex) and size of ``path``, read once in large chunks (hashlib drops the GIL)."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while got := f.readinto(buf):
            h.update(view[:got])
            n += got
    return h.hexdigest(), n


def sha256_fd(fd: int) -> tuple[str, int]:
    """SHA-256 (hex) and size of the open file ``fd``, from its start (``pread``: its offset is left alone)."""
    h = hashlib.sha256()
    n = 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while got := os.preadv(fd, [buf], n):
        h.update(view[:got])
        n += got
    return h.hexdigest(), n


def evidence_present(path: Path) -> bool:
    """Whether anything beside ``path`` may vouch for it (cheap: no hashing, no signature check)."""
    if any(path.with_name(path.name + s).exists() for s in EVIDENCE_SUFFIXES):
        return True
    return any(path.name in _read_sums(p) for p in path.parent.iterdir() if is_checksum_file(p) and p.is_file())


def _read_small(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(EVIDENCE_LIMIT + 1)[:EVIDENCE_LIMIT]
    except FileNotFoundError:
        return None


def _read_sums(path: Path) -> dict[str, str]:
    """``{file name: hex}`` of a ``sha256sum`` file (names by their last component: k3s strips ``dist/artifacts/``)."""
    raw = _read_small(path)
    out: dict[str, str] = {}
    for line in (raw or b"").decode("utf-8", "replace").splitlines():
        m = _SUM_LINE.match(line.strip())
        if m is not None:
            out[m.group(2).rsplit("/", 1)[-1]] = m.group(1).lower()
    return out


def _decode_sig(raw: bytes) -> bytes:
    """A ``.sig``'s signature: base64 (cosign's default) or the raw bytes (``--b64=false``, ``openssl dgst``)."""
    text = raw.strip()
    try:
        return base64.b64decode(text, validate=True) if text else b""
    except (binascii.Error, ValueError):
        return raw


@dataclass
class _Check:
    """The outcome of the signatures beside one file."""

    key: TrustedKey | None = None
    via: str = ""
    found: bool = False
    refusal: Refusal | None = None
    why: str = ""


def _bundle(raw: bytes, keyring: Keyring) -> tuple[bytes, list[TrustedKey]]:
    """The signature of a key-signed Sigstore bundle and the configured keys to try.

    Raises:
        ValueError: ``(Refusal, why)`` as args: not a bundle this accepts, or a hint naming an untrusted key.
    """
    try:
        doc = json.loads(raw)
        media = str(doc.get("mediaType", ""))
        content = doc.get("messageSignature")
        material = doc.get("verificationMaterial") or {}
    except (ValueError, AttributeError) as exc:
        raise ValueError(Refusal.UNSUPPORTED, f"bundle is not JSON: {exc}") from exc
    if not media.startswith("application/vnd.dev.sigstore.bundle"):
        raise ValueError(Refusal.UNSUPPORTED, f"not a Sigstore bundle (mediaType {media!r})")
    if not isinstance(content, dict):
        what = "a DSSE envelope" if "dsseEnvelope" in doc else "no messageSignature"
        raise ValueError(Refusal.UNSUPPORTED, f"bundle holds {what}; only blob signatures (messageSignature) count")
    if not isinstance(material, dict) or "publicKey" not in material:
        raise ValueError(Refusal.UNSUPPORTED, "keyless bundle (a certificate, not a key): it needs a trust root "
                                              "and a transparency log; sign with a key")
    algorithm = (content.get("messageDigest") or {}).get("algorithm", "SHA2_256")
    if algorithm != "SHA2_256":
        raise ValueError(Refusal.UNSUPPORTED, f"bundle digest algorithm {algorithm} (only SHA2_256)")
    try:
        sig = base64.b64decode(str(content["signature"]), validate=True)
    except (KeyError, binascii.Error, ValueError) as exc:
        raise ValueError(Refusal.UNSUPPORTED, "bundle signature is not base64") from exc
    hint = (material.get("publicKey") or {}).get("hint")
    if not hint:
        return sig, list(keyring.keys)
    key = keyring.by_hint(str(hint))
    if key is None:
        raise ValueError(Refusal.UNTRUSTED_KEY, f"signed with a key that is not trusted (hint SHA256:{hint})")
    return sig, [key]


def _signatures(target: Path, digest: bytes, keyring: Keyring, message: Callable[[], bytes] | None) -> _Check:
    """Judge ``<target>.sig`` and ``<target>.sigstore.json`` (the first that verifies wins)."""
    out = _Check()
    for suffix in EVIDENCE_SUFFIXES:
        ev = target.with_name(target.name + suffix)
        raw = _read_small(ev)
        if raw is None:
            continue
        out.found = True
        try:
            sig, keys = _bundle(raw, keyring) if suffix == BUNDLE_SUFFIX else (_decode_sig(raw), list(keyring.keys))
        except ValueError as exc:
            if out.refusal is None:
                out.refusal, out.why, out.via = exc.args[0], exc.args[1], ev.name
            continue
        key = next((k for k in keys if k.verifies(sig, digest, message)), None)
        if key is not None:
            out.key, out.via = key, ev.name
            return out
        if out.refusal is None:
            out.refusal, out.via = Refusal.BAD_SIGNATURE, ev.name
            out.why = "signature does not verify with any trusted key"
    return out


def _message_of(path: Path, size: int) -> Callable[[], bytes] | None:
    """Reads ``path`` whole, for Ed25519 keys (``None`` past :data:`ED25519_LIMIT`)."""
    return None if size > ED25519_LIMIT else path.read_bytes


def _constant(data: bytes) -> Callable[[], bytes]:
    return lambda: data


def judge(path: Path, keyring: Keyring, digest: str, size: int) -> Verdict:
    """What the evidence beside ``path`` (SHA-256 ``digest``, hex, of ``size`` bytes) says."""
    raw_digest = bytes.fromhex(digest)
    notes: list[str] = []
    refusal: tuple[Refusal, str, str] | None = None
    via_sums: tuple[TrustedKey, str] | None = None
    for sums in sorted(p for p in path.parent.iterdir() if is_checksum_file(p) and p.is_file()):
        listed = _read_sums(sums).get(path.name)
        if listed is None:
            continue
        if listed != digest:
            return Verdict(digest, via=sums.name, refusal=Refusal.DIGEST_MISMATCH,
                           why=f"checksum file lists it with sha256:{listed} (a truncated or corrupted copy?)")
        sums_bytes = _read_small(sums) or b""
        check = _signatures(sums, hashlib.sha256(sums_bytes).digest(), keyring, _constant(sums_bytes))
        if check.key is not None:
            via_sums = via_sums or (check.key, f"{sums.name} ({check.via})")
        elif check.found and refusal is None and check.refusal is not None:
            refusal = (check.refusal, "checksum file: " + check.why, f"{sums.name} ({check.via})")
        elif not check.found:
            notes.append(f"{sums.name} lists it but is not signed")
    direct = _signatures(path, raw_digest, keyring, _message_of(path, size))
    if direct.key is not None:
        return Verdict(digest, direct.key, direct.via)
    if via_sums is not None:
        return Verdict(digest, via_sums[0], via_sums[1])
    if direct.refusal is not None:
        return Verdict(digest, via=direct.via, refusal=direct.refusal, why=direct.why)
    if refusal is not None:
        return Verdict(digest, via=refusal[2], refusal=refusal[0], why=refusal[1])
    why = f"no signature found: {path.name}{SIG_SUFFIX}, {path.name}{BUNDLE_SUFFIX} or a signed sha256sum file"
    if notes:
        why += " (" + "; ".join(notes) + ")"
    return Verdict(digest, refusal=Refusal.NO_SIGNATURE, why=why, notes=tuple(notes))
