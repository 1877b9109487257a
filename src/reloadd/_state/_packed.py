"""Records packed into one ``bytes`` per path: what a consumer acknowledged, at ~100 bytes a path.

A :class:`~reloadd._types.PathRecord` is a frozen dataclass holding a ``Fingerprint`` (a named
tuple of four ints) and a 64-character hex digest: about 380 bytes and two objects the cyclic
garbage collector tracks, per path. With 100,000 paths that is 38 MiB, and every full
collection walks 200,000 objects (130-200 ms with the GIL held: long enough for a burst to
overflow the kernel's inotify queue while the reader thread waits). Packed, a record is one
exact ``bytes`` (never tracked by the collector) of about 100 bytes:

- one byte of flags;
- the fingerprint as ``<QQqq`` (inode, size, mtime_ns, ctime_ns), when there is one;
- the SHA-256 digest as its 32 raw bytes, when it is one (any other digest text goes below);
- then, each with a 4-byte length, the digest text, the consumer's data as compact JSON, the error.

The store keeps packed records; :func:`unpack` builds the ``PathRecord`` a consumer reads, on
access. The hot paths (a rescan comparing 100,000 fingerprints, the journal encoding) read the
packed form directly through :func:`stat_of` and :func:`members_json`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from .._types import Fingerprint, JSONValue, PathRecord

__all__ = ["HAS_FP", "RecordView", "data_json_of", "data_of", "digest_of", "dumps", "error_of", "fields_json",
           "from_json", "has_error", "journal_json", "members_json", "pack", "pack_json", "pack_record", "pack_stat",
           "stat_of", "unpack", "unpack_stat"]

_FP = struct.Struct("<QQqq")
_LEN = struct.Struct("<I")
_PLAIN = struct.Struct("<BQQqq32s")  # the common record: flags, fingerprint, SHA-256 (see pack_json, members_json)
_HAS_FP, _HAS_SHA, _HAS_TEXT, _HAS_DATA, _HAS_ERROR = 1, 2, 4, 8, 16
HAS_FP = _HAS_FP
"""The flag (in a record's first byte) of a record holding a fingerprint, as :func:`pack_stat` packs it, at
offset 1: ``raw[0] & HAS_FP and raw.startswith(stat, 1)`` is a record holding ``stat``."""
dumps = json.JSONEncoder(separators=(",", ":")).encode
"""Compact JSON text, as the state files hold it."""
_str = json.encoder.encode_basestring_ascii  # what json.dumps uses for a str, in C
_new_fp = tuple.__new__


def _sha_bytes(digest: str) -> bytes | None:
    """The 32 bytes of a 64-character lower-case hex digest, or ``None`` when it is some other text (kept as
    text: it must read back as it was). A round trip through ``bytes.fromhex``: 0.17 µs, where checking each
    character against a set took 0.66 (once per acknowledged path)."""
    try:
        raw = bytes.fromhex(digest)
    except ValueError:
        return None
    return raw if raw.hex() == digest else None


def pack(fingerprint: tuple[int, int, int, int] | None, digest: str | None = None, data: JSONValue = None,
         error: str | None = None) -> bytes:
    """One record as bytes (see the module docstring).

    Raises:
        TypeError, ValueError: ``data`` is not JSON (the store's records are written as JSON).
    """
    return pack_json(fingerprint, digest, None if data is None else dumps(data), error)


def pack_json(fingerprint: tuple[int, int, int, int] | None, digest: str | None, data: str | None,
              error: str | None) -> bytes:
    """:func:`pack` with the data already encoded as JSON text (:func:`dumps`).

    The common record (a fingerprint and a SHA-256 digest, nothing else: every path of a burst) is one ``struct``
    call; with :func:`fields_json`'s own short way, an acknowledged path is recorded and journaled in 2.18 µs,
    2.58 the general way.
    """
    if data is None and error is None and fingerprint is not None and digest is not None and len(digest) == 64:
        raw = _sha_bytes(digest)
        if raw is not None:
            return _PLAIN.pack(_HAS_FP | _HAS_SHA, *fingerprint, raw)
    flags = 0
    head = b""
    tail: list[bytes] = []
    if fingerprint is not None:
        flags |= _HAS_FP
        head = _FP.pack(*fingerprint)
    if digest is not None:
        raw = _sha_bytes(digest) if len(digest) == 64 else None
        if raw is not None:
            flags |= _HAS_SHA
            head += raw
        else:
            flags |= _HAS_TEXT
            raw = digest.encode("utf-8", "surrogateescape")
            tail += (_LEN.pack(len(raw)), raw)
    if data is not None:
        flags |= _HAS_DATA
        raw = data.encode()
        tail += (_LEN.pack(len(raw)), raw)
    if error is not None:
        flags |= _HAS_ERROR
        raw = error.encode("utf-8", "surrogateescape")
        tail += (_LEN.pack(len(raw)), raw)
    return bytes((flags,)) + head + b"".join(tail)


pack_stat: Callable[..., bytes] = _FP.pack
"""``pack_stat(*fingerprint)``: a fingerprint as 32 bytes (81 bytes of memory, against ~180 for the tuple and
its four integers), for what a walk saw of a path until a probe compares it
(:func:`reloadd._pipeline._changes.steady`)."""


unpack_stat: Callable[[bytes], tuple[int, int, int, int]] = _FP.unpack
"""The fingerprint tuple of a :func:`pack_stat`."""


def pack_record(rec: PathRecord) -> bytes:
    """:func:`pack` of a ``PathRecord``."""
    return pack(rec.fingerprint, rec.digest, rec.data, rec.error)


def stat_of(raw: bytes) -> tuple[int, int, int, int] | None:
    """The fingerprint of a packed record as a plain tuple (equal to the ``Fingerprint``), or ``None``."""
    return _FP.unpack_from(raw, 1) if raw[0] & _HAS_FP else None


def _fields(raw: bytes) -> tuple[tuple[int, int, int, int] | None, str | None, bytes | None, str | None]:
    flags = raw[0]
    off = 1
    fp = None
    if flags & _HAS_FP:
        fp = _FP.unpack_from(raw, off)
        off += _FP.size
    digest = None
    if flags & _HAS_SHA:
        digest = raw[off:off + 32].hex()
        off += 32
    parts: list[bytes | None] = []
    for bit in (_HAS_TEXT, _HAS_DATA, _HAS_ERROR):
        if flags & bit:
            (n,) = _LEN.unpack_from(raw, off)
            off += _LEN.size
            parts.append(raw[off:off + n])
            off += n
        else:
            parts.append(None)
    text, data, error = parts
    if text is not None:
        digest = text.decode("utf-8", "surrogateescape")
    return fp, digest, data, None if error is None else error.decode("utf-8", "surrogateescape")


def unpack(raw: bytes) -> PathRecord:
    """The ``PathRecord`` a packed record holds."""
    fp, digest, data, error = _fields(raw)
    return PathRecord(None if fp is None else _new_fp(Fingerprint, fp), digest,
                      None if data is None else json.loads(data), error)


def data_of(raw: bytes) -> JSONValue:
    """The consumer's data of a packed record (only the data is decoded)."""
    if not raw[0] & _HAS_DATA:
        return None
    data = _fields(raw)[2]
    return None if data is None else json.loads(data)


def data_json_of(raw: bytes) -> str | None:
    """The consumer's data of a packed record as the JSON text it was stored as (nothing decoded but UTF-8)."""
    if not raw[0] & _HAS_DATA:
        return None
    data = _fields(raw)[2]
    return None if data is None else data.decode()


def digest_of(raw: bytes) -> str | None:
    """The content digest of a packed record (only the digest is decoded)."""
    flags = raw[0]
    if flags & _HAS_SHA:
        off = 1 + (_FP.size if flags & _HAS_FP else 0)
        return raw[off:off + 32].hex()
    return _fields(raw)[1] if flags & _HAS_TEXT else None


def has_error(raw: bytes) -> bool:
    """Whether a packed record holds an error (a permanent rejection)."""
    return bool(raw[0] & _HAS_ERROR)


def error_of(raw: bytes) -> str | None:
    """The error of a packed record (only the error is decoded)."""
    return _fields(raw)[3] if raw[0] & _HAS_ERROR else None


def journal_json(raw: bytes) -> str:
    """The record as the JSON object the state files hold: ``{"fp":[…],"digest":…,"data":…,"error":…}``.

    The exact text ``json.dumps(…, separators=(",", ":"))`` gives, built without decoding the data (the text is
    :func:`fields_json`'s; a snapshot's common records take :func:`members_json`'s shorter way).
    """
    fp, digest, data, error = _fields(raw)
    return fields_json(fp, digest, None if data is None else data.decode(), error)


def members_json(records: Iterable[tuple[str, bytes]]) -> Iterator[str]:
    """``"path":{…}`` for each (path, packed record): the members of a snapshot's ``records`` object.

    The text :func:`journal_json` gives, the common record formatted in one step (its digest is hex: nothing to
    escape): a compaction of 100,000 records, written, costs 91-93 ms of CPU where a call of ``journal_json`` a
    record took 131-135 (the bytes written are the same).
    """
    common, plain, size, key_json = _HAS_FP | _HAS_SHA, _PLAIN.unpack, _PLAIN.size, _str
    for key, raw in records:
        if raw[0] == common and len(raw) == size:
            _, ino, st_size, mtime, ctime, sha = plain(raw)
            yield f'{key_json(key)}:{{"fp":[{ino},{st_size},{mtime},{ctime}],"digest":"{sha.hex()}"}}'
        else:
            yield key_json(key) + ":" + journal_json(raw)


def fields_json(fp: tuple[int, int, int, int] | None, digest: str | None, data: str | None, error: str | None) -> str:
    """:func:`journal_json` of a record given by its fields (``data`` as JSON text)."""
    if data is None and error is None and fp is not None and digest is not None:  # the common record: one formatting
        return f'{{"fp":[{fp[0]},{fp[1]},{fp[2]},{fp[3]}],"digest":{_str(digest)}}}'
    parts: list[str] = []
    if fp is not None:
        parts.append(f'"fp":[{fp[0]},{fp[1]},{fp[2]},{fp[3]}]')  # ints: str() is their JSON
    if digest is not None:
        parts.append('"digest":' + _str(digest))
    if data is not None:
        parts.append('"data":' + data)
    if error is not None:
        parts.append('"error":' + _str(error))
    return "{" + ",".join(parts) + "}"


def from_json(raw: Mapping[str, Any]) -> bytes:
    """Pack a record read from the state files (the inverse of :func:`journal_json`)."""
    fp = raw.get("fp")
    return pack(None if fp is None else Fingerprint.from_json(fp), raw.get("digest"), raw.get("data"), raw.get("error"))


class RecordView(Mapping[str, PathRecord]):
    """Packed records read as ``PathRecord`` objects, keyed by path string (live, read-only).

    Membership and iteration are the dict's own; a record is unpacked only when it is read.
    """

    __slots__ = ("_raw",)

    def __init__(self, raw: dict[str, bytes]) -> None:
        self._raw = raw

    def __getitem__(self, key: str) -> PathRecord:
        return unpack(self._raw[key])

    def get(self, key: str, default: Any = None) -> Any:
        raw = self._raw.get(key)
        return default if raw is None else unpack(raw)

    def __contains__(self, key: object) -> bool:
        return key in self._raw

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)
