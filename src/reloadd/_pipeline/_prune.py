"""Prune safety: a removal is held, never run, when a consumer's input looks lost rather than edited.

A root that disappears, is replaced by another directory, becomes unreadable (EACCES, EIO, ESTALE,
ENOTCONN) or loses every file at once is what an unmounted volume, a failed NFS server or a wrong
``rm -rf`` look like, not an operator's edit. The engine asks :class:`PruneGuard` before it hands a
deletion over (:meth:`PruneGuard.check`); a held deletion waits in the consumer's queue, outside its
work, until

* the input comes back: the path is found again and, if unchanged, nothing is handed over at all;
* a person confirms: ``reloadd reload --confirm-prune`` (or ``Reloader.confirm_prune``) hands the held
  removals over with ``Change.prune_confirmed`` set.

A consumer can hold a removal itself with the :class:`~reloadd.Hold` result (``kube-manifests``'
``max_prune``); it lands in the same table. Holds and the roots' identities are persisted beside the
records (``prune.json``), so a restart with the volume still gone deletes nothing either, and a root
replaced while reloadd was stopped is still recognised. A ``prune.json`` that cannot be read is set aside
(see :mod:`reloadd._state._persisted`) and the guard distrusts: *every* removal of the consumer is held until a
person confirms (the holds it listed are unknown, so none may run unasked); the distrust is persisted too.

Only directory roots are judged: a configured *file* root that is deleted is an ordinary delete of
one file. A root that never held a recorded path holds nothing (there was nothing to delete).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import StateError
from .._filters import PathFilter
from .._state._atomic import atomic_write
from .._state._persisted import PersistHealth, set_aside

__all__ = ["HeldRemoval", "PruneGuard", "RootId"]

log = logging.getLogger("reloadd.prune")

_VERSION = 1

RootId = tuple[int, int]
"""A directory's (st_dev, st_ino)."""

_Snapshot = tuple[dict[str, RootId], dict[str, "HeldRemoval"], str | None]


@dataclass(frozen=True, slots=True)
class HeldRemoval:
    """Why a path's removal is held, and since when (wall-clock seconds)."""

    why: str
    since: float


class PruneGuard:
    """One consumer's prune safety: judges its roots and keeps its held removals.

    Decisions that touch the disk (:meth:`check`, :meth:`removal_held`, :meth:`verdict`,
    :meth:`root_ids`) block: call them from a worker thread. Bookkeeping (:meth:`hold`,
    :meth:`release`, :meth:`confirm`, :meth:`done`, :meth:`remember_roots`, :meth:`prepare`) runs
    on the event loop.

    Args:
        filter: The consumer's path filter (its roots, include/exclude, recursion).
        records: The consumer's live records, keyed by path string (read, never written).
        owned: Whether a path string is the consumer's business (filter and ``accepts``).
        directory: Where ``prune.json`` is kept (the records' directory); ``None``: memory only.
        clock: Wall clock, for ``since``.
        health: The consumer's persistence health (a ``prune.json`` set aside is noted there).
    """

    def __init__(
        self,
        filter: PathFilter,
        records: Mapping[str, Any],
        owned: Callable[[str], bool],
        directory: Path | None,
        *,
        clock: Callable[[], float] = time.time,
        health: PersistHealth | None = None,
    ) -> None:
        self._filter = filter
        self._records = records
        self._owned = owned
        self._file = directory / "prune.json" if directory is not None else None
        self._clock = clock
        self.held: dict[str, HeldRemoval] = {}
        """Paths whose removal is held (persisted)."""
        self.confirmed: set[str] = set()
        """Held removals a person confirmed, not yet acknowledged by the consumer."""
        self._roots: dict[str, RootId] = {}
        self._dirty = False
        self._witness: dict[str, str] = {}  # root -> the file its last listing stopped at (see _witness_holds)
        self.health = health
        self.distrust: str | None = None
        """Why every removal is held until confirmed (``prune.json`` was unreadable), or ``None``."""

    # Persistence -----------------------------------------------------------------------
    def load(self, *, read_only: bool = False) -> None:
        """Read ``prune.json`` (blocking); a missing file is an empty guard.

        One that cannot be read or parsed is set aside, and every removal is held until confirmed
        (``read_only``: raised instead, naming it and the cause, for ``reloadd plan``).

        Raises:
            StateError: ``read_only`` and the file cannot be read.
        """
        try:
            self._load()
        except StateError as exc:
            if read_only or self._file is None:
                raise
            why = str(exc).removeprefix(f"{self._file}: ")
            moved = set_aside(self._file, why, "every removal is held until confirmed (`reloadd reload "
                              "--confirm-prune`)")
            if self.health is not None:
                self.health.add(moved)
            self._roots, self.held = {}, {}
            self.distrust = (f"prune state {self._file} was unreadable"
                             f"{f' (moved aside to {moved.moved_to})' if moved.moved_to else ''}: "
                             "every removal is held until confirmed")
            self._dirty = True

    def _load(self) -> None:
        if self._file is None:
            return
        try:
            raw = json.loads(self._file.read_bytes())
            if raw.get("version") != _VERSION:
                raise StateError(f"{self._file}: unsupported version {raw.get('version')!r}")
            self._roots = {str(r): (int(i[0]), int(i[1])) for r, i in raw.get("roots", {}).items()}
            held = {str(p): HeldRemoval(str(h[0]), float(h[1])) for p, h in raw.get("held", {}).items()}
            # A hold whose record is gone was settled (confirmed, or the path came back) after the last write
            # of this file: its record's removal is durable in the journal, so the hold is over.
            self.held = {k: h for k, h in held.items() if k in self._records}
            self._dirty = len(self.held) != len(held)
            distrust = raw.get("hold_all")
            self.distrust = str(distrust) if distrust else None
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StateError(f"Failed to read {self._file}: {exc.strerror or exc}") from exc
        except (ValueError, AttributeError, TypeError, IndexError, KeyError, OverflowError) as exc:
            raise StateError(f"{self._file}: corrupt prune state: {exc}") from exc

    @property
    def dirty(self) -> bool:
        """Something changed since the last :meth:`prepare`."""
        return self._dirty and self._file is not None

    def prepare(self) -> _Snapshot | None:
        """A copy of what to write when something changed since the last call (on the loop), else ``None``.

        Only copied here: encoding (tens of milliseconds for 100k held removals) is :meth:`write`'s, off the loop.
        """
        if not self._dirty or self._file is None:
            self._dirty = False
            return None
        self._dirty = False
        return dict(self._roots), dict(self.held), self.distrust

    def write(self, snapshot: _Snapshot) -> None:
        """Replace ``prune.json`` with ``snapshot`` (blocking; any thread).

        Raises:
            StateError: it cannot be written (the caller marks the guard dirty again).
        """
        assert self._file is not None
        roots, held, distrust = snapshot
        doc: dict[str, Any] = {
            "version": _VERSION,
            "roots": {r: list(i) for r, i in sorted(roots.items())},
            "held": {p: [h.why, h.since] for p, h in sorted(held.items())},
        }
        if distrust:
            doc["hold_all"] = distrust
        atomic_write(self._file, json.dumps(doc, separators=(",", ":")).encode())

    def failed(self) -> None:
        """A :meth:`write` failed: write again at the next flush."""
        self._dirty = True

    # Judging (blocking) ----------------------------------------------------------------
    def root_of(self, key: str) -> str | None:
        """The configured *directory* root ``key`` lies strictly under, or ``None``."""
        root = self._filter.root_of(key)
        if root is None:
            return None
        text = os.fspath(root)
        return text if key != text else None

    def verdict(self, root: str) -> str | None:
        """Why ``root`` looks lost rather than edited, or ``None`` when it looks fine (blocking).

        Lost: it is gone, no longer a directory, another directory than the one last seen,
        unreadable, or it held two or more recorded paths and now holds none of them and no
        other file the consumer would take.
        """
        try:
            st = os.stat(root)
        except (FileNotFoundError, NotADirectoryError):
            return f"root {root} disappeared"
        except OSError as exc:
            return f"root {root} is unreadable: {exc.strerror or exc}"
        if not stat.S_ISDIR(st.st_mode):
            return f"root {root} is no longer a directory"
        known = self._roots.get(root)
        if known is not None and known != (st.st_dev, st.st_ino):
            return f"root {root} was replaced by another directory"
        try:
            with os.scandir(root) as it:
                next(it, None)
        except FileNotFoundError:
            return f"root {root} disappeared"
        except OSError as exc:  # EACCES, EIO, ESTALE, ENOTCONN: a volume gone bad, not an edit
            return f"root {root} is unreadable: {exc.strerror or exc}"
        if self._witness_holds(root):
            return None  # the file found there last time is still there: an edit, not a loss
        listed: set[str] = set()
        present: set[str] = set()
        if self._holds_any_file(root, listed, present):
            return None  # files are left (or replaced by others): an edit, not a loss
        # Only an emptied root costs a pass over the records (an ordinary delete stops above at its first file).
        # The walk above listed every directory it could, so whether a recorded path is still there (a file
        # the consumer no longer takes) is a set lookup; only paths in directories it did not list are probed.
        prefix = root.rstrip("/") + "/"
        recorded = 0
        for k in list(self._records):
            if not k.startswith(prefix):
                continue
            recorded += 1
            if (k in present) if k.rpartition("/")[0] in listed else os.path.lexists(k):
                return None
        if recorded < 2:
            return None  # deleting the one file left is an ordinary delete
        return f"every file under root {root} went at once"

    def _holds_any_file(self, root: str, listed: set[str], present: set[str]) -> bool:
        """Whether a file the consumer would take is under ``root``: stops at the first one, listing as it goes.

        Adds each directory listed whole to ``listed`` and every name found in them to ``present``.
        """
        stack = [root.rstrip("/") or "/"]
        while stack:
            top = stack.pop()
            try:
                with os.scandir(top) as entries:
                    for e in entries:
                        present.add(e.path)
                        if e.name.startswith(".."):
                            continue  # a ConfigMap's ..data swap dirs
                        if e.is_dir():  # a symlink to a directory is not followed, nor taken for a file
                            if self._filter.recursive and not e.is_symlink():
                                stack.append(e.path)
                        elif self._owned(e.path):
                            self._witness[root] = e.path
                            return True
            except OSError:
                continue
            listed.add(top)
        return False

    def _witness_holds(self, root: str) -> bool:
        """Whether the file :meth:`_holds_any_file` stopped at last under ``root`` is still there as it would find
        it: each directory on the way a directory, not a symlink (a listing does not follow one), and readable;
        the file itself not a directory. A few system calls where a listing took the root's every entry, and more
        (a burst of deletions asks once per settling step: 100,000 files unlinked at 10,500 a second, 2.45 s of
        CPU where it took 2.51, medians of 3)."""
        witness = self._witness.get(root)
        if witness is None:
            return False
        top = root.rstrip("/") or "/"
        d = top
        for part in witness[len(top):].strip("/").split("/")[:-1]:
            d = d.rstrip("/") + "/" + part
            try:
                st = os.lstat(d)
            except OSError:
                return False
            if not stat.S_ISDIR(st.st_mode):
                return False
        if not os.access(d, os.R_OK | os.X_OK):
            return False  # the listing would not get in there any more
        try:
            return not stat.S_ISDIR(os.stat(witness).st_mode)
        except FileNotFoundError:
            return os.path.lexists(witness)  # a dangling symlink: a listing meets it as a file
        except OSError:
            return False

    def check(self, keys: Iterable[str]) -> dict[str, str]:
        """Which of these deletions about to be handed over must be held, and why (blocking).

        A path already held stays held (a restart finds it gone again); a confirmed one is let
        through; the rest are judged by their root, once per root.
        """
        out: dict[str, str] = {}
        verdicts: dict[str, str | None] = {}
        for key in keys:
            if key in self.confirmed:
                continue
            held = self.held.get(key)
            if held is not None:
                out[key] = held.why
                continue
            if self.distrust is not None:
                out[key] = self.distrust
                continue
            root = self.root_of(key)
            if root is None:
                continue
            if root not in verdicts:
                verdicts[root] = self.verdict(root)
            why = verdicts[root]
            if why is not None:
                out[key] = why
        return out

    def removal_held(self, path: Path | str) -> str | None:
        """Why removing what ``path`` declared must not run now, or ``None`` (blocking: may stat).

        For consumers that act on the whole input at once (``registry-mirrors`` re-reads every
        drop-in): a recorded path that is gone while its root looks lost is held before the engine
        has even handed its deletion over.
        """
        key = os.fspath(path)
        if key in self.confirmed:
            return None
        held = self.held.get(key)
        if held is not None:
            return held.why
        if key not in self._records or os.path.lexists(key):
            return None
        if self.distrust is not None:
            return self.distrust
        root = self.root_of(key)
        return self.verdict(root) if root is not None else None

    def root_ids(self) -> dict[str, RootId]:
        """The identity of every directory root that exists now (blocking)."""
        out: dict[str, RootId] = {}
        for root in self._filter.roots:
            try:
                st = os.stat(root)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                out[os.fspath(root)] = (st.st_dev, st.st_ino)
        return out

    # Bookkeeping (event loop) ------------------------------------------------------------
    def remember_roots(self, ids: Mapping[str, RootId]) -> None:
        """Take these root identities as the good ones, except for roots with removals held under them."""
        for root, rid in ids.items():
            if self._roots.get(root) == rid:
                continue
            prefix = root.rstrip("/") + "/"
            if any(k.startswith(prefix) for k in self.held):
                continue  # the lost root is what the holds are about: keep what it was
            self._roots[root] = rid
            self._dirty = True

    def hold(self, key: str, why: str) -> tuple[HeldRemoval, bool]:
        """Hold the removal of ``key``; returns the entry (an earlier one keeps its ``since``) and if it is new."""
        held = self.held.get(key)
        if held is not None and held.why == why:
            return held, False
        entry = HeldRemoval(why, held.since if held is not None else self._clock())
        self.held[key] = entry
        self._dirty = True
        return entry, held is None

    def release(self, key: str) -> bool:
        """The input came back (or changed): forget the hold of ``key``; returns whether there was one."""
        if self.held.pop(key, None) is None:
            return False
        self._dirty = True
        return True

    def confirm(self, keys: Iterable[str] | None = None) -> list[str]:
        """A person confirmed: the removals of ``keys`` (every held one when ``None``) may run."""
        chosen = list(self.held) if keys is None else [k for k in keys if k in self.held]
        if keys is None and self.distrust is not None:
            self.distrust = None  # a person looked: removals are judged by their roots again
            self._dirty = True
        for key in chosen:
            del self.held[key]
            self.confirmed.add(key)
        if chosen:
            self._dirty = True
        return chosen

    def done(self, key: str) -> None:
        """The removal of ``key`` was acknowledged (or the path came back)."""
        self.confirmed.discard(key)
