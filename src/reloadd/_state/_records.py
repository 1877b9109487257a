"""Crash-safe persistence of what each consumer acknowledged.

Per consumer, a snapshot (``records.json``, replaced atomically: temp file in the same
directory, fsync, rename, fsync of the directory) and an append-only journal
(``records.journal``, one JSON line per change, fsynced per batch). Loading replays the
journal over the snapshot and ignores a torn last line, so a crash at any point loses at
most the batch that had not been fsynced yet — never the file. The journal is folded into
a new snapshot once it holds more lines than both a threshold and the number of records
(so a growing store is compacted a logarithmic, not a linear, number of times), and not in
the middle of a burst unless the journal reached twice that (:meth:`RecordStore.prepare`); the
snapshot names the journal generation it is followed by, so an old journal is never
replayed over a newer snapshot.

A file that cannot be read is set aside (see :mod:`reloadd._state._persisted`): a snapshot (and the journals that
follow it), and the consumer starts from no records, handing every file over again once; a journal with
damaged lines (whole lines: a torn last line is a crash's ordinary mark, cut silently) is moved aside after
its good lines are read, and a snapshot of what was read is written at the next flush.

Paths are held as strings (one per record; ``Path`` objects cost several times more and
hash in Python), and journal lines are encoded by hand in the exact form ``json.dumps``
gives, so a 100,000-path burst costs neither a ``Path`` nor a ``json.dumps`` per path.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import StateError
from .._types import Fingerprint, JSONValue, PathRecord
from ._atomic import atomic_write, write_all
from ._packed import (
    RecordView,
    dumps,
    error_of,
    fields_json,
    from_json,
    has_error,
    members_json,
    pack_json,
    unpack,
)
from ._persisted import PersistHealth, set_aside

__all__ = ["FlushJob", "RecordStore"]

log = logging.getLogger("reloadd.state")

_VERSION = 1

_EVERY_AGAIN = "starting from no records: every file is handed over again once"




_str = json.encoder.encode_basestring_ascii  # what json.dumps uses for a str, in C


def _snapshot_chunks(gen: int, records: Iterable[tuple[str, bytes]], per_chunk: int = 2048) -> Iterator[bytes]:
    """The snapshot document of ``records`` (path, packed record), encoded a few thousand at a time."""
    yield f'{{"version":{_VERSION},"gen":{gen},"records":{{'.encode()
    members = members_json(records)
    sep = ""
    while chunk := list(itertools.islice(members, per_chunk)):
        yield (sep + ",".join(chunk)).encode()
        sep = ","
    yield b"}}"


_SHRINK_FROM = 4096
"""Tables that held fewer paths than this are never rebuilt smaller (see :meth:`RecordStore.drop`)."""


class RecordStore(Mapping[Path, PathRecord]):
    """The records of one consumer: an in-memory mapping backed by snapshot + journal.

    Keys are looked up by ``Path`` or by ``str`` (held as strings inside); iteration
    yields ``Path`` objects, as the mapping promises consumers. Mutations (:meth:`put`,
    :meth:`drop`) are buffered until :meth:`flush`, which the engine calls (in a worker
    thread) once per finished batch.

    Args:
        directory: The consumer's state directory (created 0700); ``None`` keeps the
            records in memory only (an embedder that wants no persistence): nothing is
            read or written, and a restart hands every path over again.
        compact_after: Journal lines after which :meth:`flush` writes a new snapshot.
        health: How persisting goes (files set aside, failing writes); a new one by default.
    """

    def __init__(self, directory: Path | None, compact_after: int = 10_000,
                 health: PersistHealth | None = None) -> None:
        self.directory = directory
        self.health = health if health is not None else PersistHealth(directory.name if directory else "memory")
        """Files set aside at load and write failures (status, metrics); the queue reports its writes here."""
        self._force_compact = False  # what was loaded is not all on disk as it is: snapshot it at the next flush
        self._snapshot = directory / "records.json" if directory is not None else Path()
        self._gen = 0
        self._records: dict[str, bytes] = {}  # packed (see reloadd._state._packed): one untracked bytes a path
        self.keys_version = 0  # moves whenever a path is added or dropped (not when a record is replaced)
        self._peak = 0  # the most paths held since the table was last rebuilt
        self._view = RecordView(self._records)
        self._buffer: list[str] = []
        self._journal_lines = 0
        self._compact_after = compact_after
        self._snapshot_size = 0  # records the snapshot holds (the journal may grow as long before a compaction)

    # Mapping interface -------------------------------------------------------------
    def __getitem__(self, key: Path | str) -> PathRecord:
        return unpack(self._records[os.fspath(key)])

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str | os.PathLike) and os.fspath(key) in self._records

    def get(self, key: Path | str, default: Any = None) -> Any:
        """The record of ``key``, or ``default``."""
        return self._view.get(os.fspath(key), default)

    def __iter__(self) -> Iterator[Path]:
        return (Path(k) for k in self._records)

    def __len__(self) -> int:
        return len(self._records)

    def values(self) -> Iterator[PathRecord]:  # type: ignore[override]
        """The records (unpacked one at a time)."""
        return (unpack(raw) for raw in self._records.values())

    @property
    def by_str(self) -> Mapping[str, PathRecord]:
        """The live records keyed by path string (read-only; unpacked as read).

        The same object for the store's lifetime, so callers may keep it.
        """
        return self._view

    @property
    def packed(self) -> Mapping[str, bytes]:
        """The live packed records keyed by path string (the engine's hot paths; never mutate it)."""
        return self._records

    def rejected(self) -> int:
        """How many paths are held by a permanent error."""
        return sum(1 for r in self._records.values() if has_error(r))

    def errors(self) -> Iterator[tuple[str, str]]:
        """(path, error) of every path held by a permanent error."""
        for key, raw in self._records.items():
            if has_error(raw):
                yield key, error_of(raw) or ""

    @property
    def persistent(self) -> bool:
        """Whether the records are kept on disk (``False``: in memory only)."""
        return self.directory is not None

    @property
    def _journal(self) -> Path:
        assert self.directory is not None
        return self.directory / f"records.journal.{self._gen}"

    # Persistence ---------------------------------------------------------------------
    def load(self, *, read_only: bool = False) -> None:
        """Read snapshot and journal (blocking; nothing to read when in memory).

        Args:
            read_only: Touch nothing (``reloadd plan`` beside a running daemon): no
                directory is created or chmod-ed, a torn journal tail is skipped but not
                truncated, and a snapshot compacted by the daemon meanwhile is read again.
        """
        if self.directory is None:
            return
        if not read_only:
            try:
                self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
                os.chmod(self.directory, 0o700)
            except OSError as exc:
                raise StateError(f"Failed to create state directory {self.directory}: {exc.strerror}") from exc
        for _ in range(5):  # a daemon compacting between our two reads: read both again
            try:
                records, lines, good_end, damaged = self._read()
            except StateError as exc:
                if read_only:
                    raise
                records, lines, good_end, damaged = self._set_aside_snapshot(exc), 0, None, False
            if not read_only or self._read_gen() == self._gen:
                break
        if read_only:
            pass
        elif damaged:
            self.health.add(set_aside(self._journal, "damaged lines", "its good lines were read; the files of its "
                                      "damaged lines are handed over again once"))
            self._force_compact = True
            lines, good_end = 0, None
        elif good_end is not None and os.path.getsize(self._journal) != good_end:
            try:
                os.truncate(self._journal, good_end)  # the next append must not glue onto a torn line
            except OSError as exc:
                self.health.add(set_aside(self._journal, f"a torn last line could not be cut: {exc.strerror}",
                                          "its good lines were read; the file of the torn line is handed over "
                                          "again once"))
                self._force_compact = True
                lines = 0
        if not read_only:
            self._set_aside_stale_journals()
        self._records.clear()  # in place: by_str stays the live mapping
        self._records.update(records)
        self._peak = len(records)
        self.keys_version += 1
        self._journal_lines = lines

    def _set_aside_snapshot(self, exc: StateError) -> dict[str, bytes]:
        """The snapshot cannot be read: set it aside, and the journals that follow it; no records."""
        why = str(exc).removeprefix(f"{self._snapshot}: ")
        if self._snapshot.exists():
            self.health.add(set_aside(self._snapshot, why, _EVERY_AGAIN))
        assert self.directory is not None
        for journal in sorted(self.directory.glob("records.journal.*")):
            if journal.name.removeprefix("records.journal.").isdigit():
                self.health.add(set_aside(journal, f"it follows the snapshot set aside ({why})", _EVERY_AGAIN))
        self._gen = 0
        self._snapshot_size = 0
        return {}

    def _set_aside_stale_journals(self) -> None:
        """A journal newer than the snapshot says the snapshot it followed is gone: set it aside.

        Left in place, it would be replayed over a later snapshot of the same generation. Older ones
        are leftovers of a compaction cut short (their snapshot was written): removed, as compaction does.
        """
        assert self.directory is not None
        for journal in self.directory.glob("records.journal.*"):
            gen = journal.name.removeprefix("records.journal.")
            if not gen.isdigit() or int(gen) == self._gen:
                continue
            if int(gen) < self._gen:
                with contextlib.suppress(OSError):
                    os.unlink(journal)
                continue
            self.health.add(set_aside(journal, f"its snapshot (generation {gen}) is missing",
                                      "its lines are not replayed: their files are handed over again once"))

    def _read_gen(self) -> int:
        try:
            return int(json.loads(self._snapshot.read_bytes()).get("gen", 0))
        except (OSError, ValueError, AttributeError, TypeError):
            return 0

    def _read(self) -> tuple[dict[str, bytes], int, int | None, bool]:
        """Snapshot plus journal: the records, the journal's line count, where its good part ends, and
        whether a whole line of it was damaged (a torn last line is not).

        Raises:
            StateError: the snapshot cannot be read (the caller sets it aside).
        """
        records: dict[str, bytes] = {}
        self._gen = 0
        self._snapshot_size = 0
        try:
            raw = json.loads(self._snapshot.read_bytes())
            if raw.get("version") != _VERSION:
                raise StateError(f"{self._snapshot}: unsupported state version {raw.get('version')!r}")
            self._gen = int(raw.get("gen", 0))
            for p, r in raw.get("records", {}).items():
                records[p] = from_json(r)
            self._snapshot_size = len(records)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StateError(f"Failed to read {self._snapshot}: {exc.strerror}") from exc
        except (ValueError, AttributeError, TypeError, KeyError, IndexError) as exc:
            raise StateError(f"{self._snapshot}: corrupt state file: {exc}") from exc
        lines = 0
        good_end = 0
        damaged = False
        try:
            with open(self._journal, "rb") as fh:
                for line in fh:
                    lines += 1
                    try:
                        if not line.endswith(b"\n"):
                            raise ValueError("no newline")
                        op = json.loads(line)
                        path = op["p"]
                        if not isinstance(path, str):
                            raise TypeError("path is not a string")
                        if op.get("del"):
                            records.pop(path, None)
                        else:
                            records[path] = from_json(op.get("r", {}))
                    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
                        if line.endswith(b"\n"):
                            damaged = True  # a whole line that is not ours: not a crash's torn tail
                        log.warning("Ignoring torn line %d of %s", lines, self._journal)
                        continue
                    good_end = fh.tell()
        except FileNotFoundError:
            return records, lines, None, False
        except OSError as exc:  # EIO: what was read is kept, the journal is set aside
            log.warning("Failed to read %s: %s", self._journal, exc.strerror)
            return records, lines, None, True
        return records, lines, good_end, damaged

    def put(self, path: Path | str, record: PathRecord) -> None:
        """Set the record of ``path`` (buffered until :meth:`flush`).

        Raises:
            TypeError, ValueError: the record's ``data`` is not JSON.
        """
        self.set(os.fspath(path), record.fingerprint, record.digest, record.data, record.error)

    def set(self, key: str, fingerprint: Fingerprint | None, digest: str | None = None, data: JSONValue = None,
            error: str | None = None) -> None:
        """:meth:`put` of a record given by its fields (no ``PathRecord`` built, the data encoded once)."""
        self.set_json(key, fingerprint, digest, None if data is None else dumps(data), error)

    def set_json(self, key: str, fingerprint: Fingerprint | None, digest: str | None, text: str | None,
                 error: str | None = None) -> None:
        """:meth:`set` with the data already encoded as JSON text (``data_json_of`` a record: carried over as is)."""
        records = self._records
        n = len(records)
        records[key] = pack_json(fingerprint, digest, text, error)
        if len(records) != n:
            self.keys_version += 1
            if n >= self._peak:
                self._peak = n + 1
        if self.directory is not None:
            self._buffer.append('{"p":' + _str(key) + ',"r":' + fields_json(fingerprint, digest, text, error) + "}")

    def drop(self, path: Path | str) -> None:
        """Forget ``path`` (buffered until :meth:`flush`)."""
        key = os.fspath(path)
        records = self._records
        if records.pop(key, None) is None:
            return
        self.keys_version += 1
        if self.directory is not None:
            self._buffer.append('{"p":' + _str(key) + ',"del":true}')

    def shrink(self) -> None:
        """Give back the table of paths removed en masse (a dict never shrinks: after a removal of 100,000
        of 200,000 paths its table stays sized for 200,000, 7.3 MiB, where 100,000 need 3.7 MiB).

        Rebuilt in place (``by_str`` and ``packed`` stay the live mappings) once it holds under half the most
        it held (a table for half as many paths is at least one size smaller). Call it only when no other
        thread reads the records (the engine does, when idle): between its two steps the table is empty.
        """
        records = self._records
        if self._peak > _SHRINK_FROM and len(records) < self._peak // 2:
            kept = dict(records)
            records.clear()
            records.update(kept)
            self._peak = len(records)

    @property
    def dirty(self) -> bool:
        """Whether there are unflushed mutations."""
        return bool(self._buffer)

    def _compaction_limit(self) -> int:
        # Compacted once the journal outgrows the records both as the snapshot holds them and as they are now:
        # loading replays at most about twice the snapshot (three times after a burst put it off), and a mass
        # removal (100,000 paths acknowledged gone in a burst) writes one small snapshot at its end, not one each
        # time half the rest is gone.
        return max(self._compact_after, self._snapshot_size, len(self._records))

    @property
    def compaction_due(self) -> bool:
        """Whether the journal has outgrown the records (the next :meth:`prepare` not ``busy`` compacts)."""
        return self._force_compact or self._journal_lines + len(self._buffer) > self._compaction_limit()

    def prepare(self, *, busy: bool = False) -> FlushJob | None:
        """Detach the buffered mutations for :meth:`write` (call on the owning thread).

        ``busy``: more work is on its way (a burst): a compaction that is due waits for the first flush
        after it, unless the journal has grown to twice its limit (loading then replays at most about three
        times the snapshot). A 100,000-path burst no longer encodes every record again in its middle.
        A compaction that is due is prepared even with nothing buffered.
        """
        limit = self._compaction_limit()
        lines = self._buffer
        over = self._journal_lines + len(lines) - limit
        if self._force_compact and self.directory is not None:
            over = 2 * limit + 1  # what was loaded must reach a snapshot of its own, burst or not
        if not lines and (over <= 0 or busy):  # in memory only: nothing is ever journaled, never over
            return None
        self._buffer = []
        snapshot = None
        if over > (limit if busy else 0):
            # The paths and their records, as two tuples (values are immutable, so this is what the table holds
            # now, encoded by write()): 200,000 records, 3.0 MiB and 2.4 ms on the loop, against 7.3 MiB and
            # 18 ms for a copy of the table, at the end of a burst, when memory peaks.
            snapshot = (tuple(self._records), tuple(self._records.values()))
        return FlushJob(lines, snapshot)

    def failed(self, job: FlushJob) -> None:
        """Put a job that could not be written back in front of the buffer (retried next flush)."""
        self._buffer[:0] = job.lines

    def write(self, job: FlushJob) -> None:
        """Append ``job`` to the journal and fsync, or compact (blocking; any thread).

        Raises:
            StateError: when the journal or snapshot cannot be written; the journal is
                left without a torn half-batch.
        """
        if job.snapshot is not None:
            keys, values = job.snapshot
            self._compact(zip(keys, values, strict=True), len(keys))
            return
        data = ("\n".join(job.lines) + "\n").encode()
        try:
            fd = os.open(self._journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                start = os.lseek(fd, 0, os.SEEK_END)
                try:
                    write_all(fd, data)
                    os.fsync(fd)
                except OSError:
                    os.ftruncate(fd, start)  # no torn half-batch left behind
                    raise
            finally:
                os.close(fd)
        except OSError as exc:
            raise StateError(f"Failed to write {self._journal}: {exc.strerror or exc}", path=str(self._journal),
                             cause=exc.strerror or str(exc)) from exc
        self._journal_lines += len(job.lines)

    def flush(self) -> None:
        """:meth:`prepare` and :meth:`write` in one blocking call."""
        job = self.prepare()
        if job is None:
            return
        try:
            self.write(job)
        except StateError:
            self.failed(job)
            raise

    def compact(self) -> None:
        """Write a new snapshot of every record and start a new journal (blocking)."""
        self._buffer.clear()
        if self.directory is None:
            return
        self._compact(self._records.items(), len(self._records))

    def _compact(self, records: Iterable[tuple[str, bytes]], count: int) -> None:
        old = self._journal
        atomic_write(self._snapshot, _snapshot_chunks(self._gen + 1, records))
        self._force_compact = False
        self._gen += 1
        self._snapshot_size = count
        with contextlib.suppress(OSError):
            os.unlink(old)
        self._journal_lines = 0


@dataclass(frozen=True)
class FlushJob:
    """Mutations detached from the buffer; ``snapshot`` set when this flush compacts."""

    lines: list[str]
    snapshot: tuple[tuple[str, ...], tuple[bytes, ...]] | None = None  # every path, and its record
