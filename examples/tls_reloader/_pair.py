"""Read a certificate/key pair and load it into a server SSLContext, or say why it cannot be served."""

from __future__ import annotations

import hashlib
import os
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Files", "Pair", "PairError", "load_pair", "read_files"]

_BEGIN = b"-----BEGIN CERTIFICATE-----"
_END = b"-----END CERTIFICATE-----"


class PairError(Exception):
    """The files on disk are not a servable pair (unreadable, not PEM, or cert and key do not match)."""


@dataclass(frozen=True)
class Files:
    """Both files' bytes, read once (``None``: unreadable, the reason in ``errors``)."""

    cert: Path
    key: Path
    cert_pem: bytes | None
    key_pem: bytes | None
    errors: tuple[str, ...] = ()

    def sha256(self, path: Path) -> str | None:
        """SHA-256 hex of the bytes read for ``path`` (the cert or the key)."""
        data = self.cert_pem if path == self.cert else self.key_pem if path == self.key else None
        return None if data is None else hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Pair:
    """A pair that loaded: the context to serve it with and what identifies it.

    Attributes:
        context: A server context holding exactly this certificate and key.
        files: The bytes it was loaded from.
        fingerprint: SHA-256 hex of the leaf certificate (DER), what a client sees.
    """

    context: ssl.SSLContext
    files: Files
    fingerprint: str

    def __str__(self) -> str:
        return f"certificate sha256:{self.fingerprint[:16]}"


def read_files(cert: Path, key: Path) -> Files:
    """Read both files (blocking; run it in a thread)."""
    pems: list[bytes | None] = []
    errors: list[str] = []
    for path in (cert, key):
        try:
            pems.append(path.read_bytes())
        except OSError as exc:
            pems.append(None)
            errors.append(f"Failed to read {path}: {exc.strerror or exc}")
    return Files(cert, key, pems[0], pems[1], tuple(errors))


def load_pair(files: Files) -> Pair:
    """Load exactly the bytes read (blocking; run it in a thread).

    They are loaded from a private copy, so what was checked is what is served even
    while a writer replaces one of the files.

    Raises:
        PairError: naming the file and the cause; ``load_cert_chain`` raises on a key
            that does not belong to the certificate, which is how a half-rotated pair shows.
    """
    if files.cert_pem is None or files.key_pem is None:
        raise PairError("; ".join(files.errors))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory(prefix="tls-pair-") as tmp:  # 0700
        cert_copy, key_copy = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
        _write_private(cert_copy, files.cert_pem)
        _write_private(key_copy, files.key_pem)
        try:
            context.load_cert_chain(cert_copy, key_copy, password=_no_password(files.key))
        except ssl.SSLError as exc:
            if exc.reason == "KEY_VALUES_MISMATCH":
                raise PairError(f"{files.key} does not belong to the certificate in {files.cert}") from exc
            raise PairError(f"Failed to load {files.cert} and {files.key}: {exc.reason or exc}") from exc
    return Pair(context, files, hashlib.sha256(_leaf_der(files.cert_pem)).hexdigest())


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with open(fd, "wb") as f:
        f.write(data)


def _no_password(key: Path) -> Callable[[], bytes]:
    # Without a callback OpenSSL would prompt on the terminal for an encrypted key.
    def refuse() -> bytes:
        raise PairError(f"{key} is encrypted; only unencrypted keys are supported")

    return refuse


def _leaf_der(cert_pem: bytes) -> bytes:
    """The first certificate of a PEM chain, as DER (load_cert_chain already parsed it)."""
    start = cert_pem.index(_BEGIN)
    end = cert_pem.index(_END, start) + len(_END)
    return ssl.PEM_cert_to_DER_cert(cert_pem[start:end].decode("ascii"))
