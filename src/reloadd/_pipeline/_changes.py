"""Change decisions: did a path change, and what is it to its consumer?

Every "is this different from what the consumer acknowledged?" in reloadd is answered here:

- :func:`steady` — the aggregator's settling test (two probes a quiet period apart agree);
- :func:`digest_all` — content digests for a hand-over (or why there is none);
- :func:`needed` / :func:`change_kind` — the queue's de-duplication rule and what a hand-over
  is (added, modified, deleted), shared with ``reloadd plan``;
- :func:`repeats` — a path queued (or held) again with nothing new;
- :func:`diff` — a stat walk compared with each consumer's acknowledged fingerprints (the
  engine's reconcile and ``reloadd plan``);
- :func:`unchanged` (public as ``reloadd.unchanged``) — a plugin's "applied already, as it is?".

Pure functions over records and fingerprints, except :func:`diff` and :func:`digest_all`,
which read the file system through :mod:`reloadd._pipeline._scan` (blocking: run them in a thread).
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from .._filters import PathFilter, under
from .._state._packed import digest_of, pack_record, pack_stat, stat_of
from .._types import Change, ChangeKind, Fingerprint, PathRecord
from ._digests import DigestCache
from ._inorder import InOrder
from ._item import Item
from ._prune import PruneGuard, RootId
from ._scan import (
    Found,
    Listing,
    Probe,
    Trust,
    WalkStopped,
    local_devices,
    present,
    probe,
    probe_read,
    scan,
)

__all__ = ["CHANGED", "UNREADABLE", "UNSEEN", "Diff", "Needed", "Recorded", "View", "change_kind", "diff",
           "digest_all", "needed", "needed_packed", "probe_all", "repeats", "steady", "unchanged"]


UNSEEN: object = object()
"""Not probed yet: no fingerprint to compare a probe with (see :func:`steady`)."""


def steady(seen: object, fingerprint: Fingerprint | None) -> bool:
    """Whether a path probed again is as the previous probe saw it (settled), ``seen`` being that probe.

    ``seen`` is a fingerprint, ``None`` (gone), :data:`UNSEEN`, or a walk's stat packed (:func:`pack_stat`).
    """
    if type(seen) is bytes:
        return fingerprint is not None and pack_stat(*fingerprint) == seen
    return seen == fingerprint


def repeats(old: Item, new: Item) -> bool:
    """Whether ``new`` brings nothing ``old`` (queued or held for the same path) does not: same file, not forced."""
    return old.fingerprint == new.fingerprint and not new.forced


def unchanged(change: Change, record: PathRecord | None) -> bool:
    """Whether ``change`` hands over what the consumer acknowledged last, as it is (its content digest).

    For a plugin that must look at every hand-over (times or the inode moved, a restart) but need not
    act on one whose content it already applied without error. Never true for a forced change.
    """
    return (not change.forced and record is not None and record.error is None
            and change.digest is not None and record.digest == change.digest)


class Needed(enum.Enum):
    """Whether a settled path must be handed over, compared with its record."""

    YES = "yes"
    """It differs from what the consumer acknowledged (or the hand-over is forced)."""

    NO = "no"
    """Same fingerprint as acknowledged, or gone and never acknowledged."""

    SAME_CONTENT = "same-content"
    """Only times (or the inode) moved: the content digest equals the acknowledged one."""


def needed(rec: PathRecord | None, fingerprint: Fingerprint | None, digest: str | None, *,
           forced: bool = False) -> Needed:
    """The queue's de-duplication rule, shared with ``reloadd plan`` (pure): :func:`needed_packed` of ``rec``."""
    return needed_packed(None if rec is None else pack_record(rec), fingerprint, digest, forced=forced)


def needed_packed(raw: bytes | None, fingerprint: Fingerprint | None, digest: str | None, *,
                  forced: bool = False) -> Needed:
    """The queue's de-duplication rule, on a packed record (:mod:`reloadd._state._packed`), read without unpacking
    it."""
    if forced:
        return _YES
    if raw is None:
        return _NO if fingerprint is None else _YES
    if fingerprint is None:
        return _YES
    if stat_of(raw) == fingerprint:
        return _NO
    if digest is not None and digest_of(raw) == digest:
        return _SAME_CONTENT
    return _YES


_YES, _NO, _SAME_CONTENT = Needed.YES, Needed.NO, Needed.SAME_CONTENT  # read once: ~60 ns a read through the class


def change_kind(rec: object | None, fingerprint: Fingerprint | None) -> ChangeKind:
    """What a needed hand-over is to the consumer: added, modified or deleted (pure).

    ``rec`` is the path's record (a ``PathRecord`` or packed), ``None`` when it has none.
    """
    if fingerprint is None:
        return _DELETED
    return _ADDED if rec is None else _MODIFIED


_DELETED, _ADDED, _MODIFIED = ChangeKind.DELETED, ChangeKind.ADDED, ChangeKind.MODIFIED  # read once (~0.1 µs each)


CHANGED = "changed"
UNREADABLE = "unreadable:"


def digest_all(
    cache: DigestCache, want: list[tuple[str, Fingerprint]]
) -> dict[tuple[str, Fingerprint], str | None]:
    out: dict[tuple[str, Fingerprint], str | None] = {}
    for p, fp in want:
        try:
            d = cache.digest(p, fp)
        except OSError as exc:
            d = UNREADABLE + (exc.strerror or str(exc))
        out[(p, fp)] = CHANGED if d is None else d
    return out


def probe_all(jobs: list[tuple[tuple[str, str], Path]], reads: list[bool], limit: int
              ) -> tuple[list[Probe], dict[tuple[str, Fingerprint], str | None]]:
    """Probe each ``(key, root)`` of a settling step; those ``reads`` marks, when a regular file of at most
    ``limit`` bytes, are read at once (:func:`reloadd._pipeline._scan.probe_read`): their digests, by path and the
    fingerprint they were read at (the rest are read by :func:`digest_all`, if handed over). Blocking."""
    probes: list[Probe] = []
    known: dict[tuple[str, Fingerprint], str | None] = {}  # typed as digest_all's answers: the step's table
    for (key, root), read in zip(jobs, reads, strict=True):
        if read:
            pr, digest = probe_read(key[1], root, limit)
            if digest is not None:
                assert pr.fingerprint is not None
                known[(key[1], pr.fingerprint)] = digest
        else:
            pr = probe(key[1], root)
        probes.append(pr)
    return probes, known


@dataclass
class View:
    """A consumer as the reconcile thread sees it: live objects it only reads with ``get``/``in``."""

    name: str
    filter: PathFilter
    owns: Mapping[str, bool]
    records: Mapping[str, bytes]  # RecordStore.packed
    queued: Callable[[str, object], object]  # WorkQueue.queued_fingerprint
    settling: Callable[[tuple[str, str]], bool]  # Aggregator.is_settling: (consumer, path) held now (a live look)
    prune_held: frozenset[str] = frozenset()  # removals held: looked at when found, not re-judged when missing
    guard: PruneGuard | None = None  # set on a walk of every root: its roots' identities are taken after it
    pending: Callable[[], list[str]] = list  # WorkQueue.pending_additions: paths queued or in flight as files
    keys_version: int | None = None  # RecordStore.keys_version when the view was made (None: never memoised)
    learned: dict[str, bool] = field(default_factory=dict)

    def owned(self, key: str) -> bool:
        hit = self.owns.get(key)
        if hit is None:
            hit = self.learned.get(key)
            if hit is None:
                hit = self.learned[key] = self.filter.matches(key)
        return hit


@dataclass(frozen=True)
class Recorded:
    """A consumer's recorded paths under a walk's scope, kept across walks while its set of keys is the same.

    An idle rescan of 10,000 files went twice over every record (a set of them, then a count of those
    in the directories it did not list); kept, the counts cost a version comparison.
    """

    version: int  # RecordStore.keys_version the keys were read at (or just after)
    scope: tuple[str, ...]
    held: frozenset[str]  # the held removals then (not counted)
    total: int  # recorded paths under the scope
    per_dir: dict[str, int]  # how many of them each directory holds (a key's parent, as the walk names it)


@dataclass(frozen=True)
class Resume:
    """Where a stopped walk of every root left off (:attr:`Diff.resume`): the next walk goes on from there.

    Attributes:
        jobs: The walk's jobs in the order the next walk takes them: the one stopped first, those not
            begun, then those done (walked again: events may have been lost there meanwhile).
        start: The stopped job's directories as :func:`~reloadd._pipeline._scan.scan` takes them (``start``): those
            left first, then those it had walked.
    """

    jobs: tuple[tuple[str, str, bool], ...]
    start: tuple[str, ...]


@dataclass
class Diff:
    observe: dict[str, dict[str, object]] = field(default_factory=dict)
    """Per consumer, path -> seen: seen is the walk's stat of the path (packed, :func:`pack_stat`: a
    100,000-path start-up pass holds them all until they are probed, no other object per path), ``None`` when
    the walk found it gone, :data:`UNSEEN` when it was listed without a stat. The aggregator takes a
    stat as the first of the two equal probes a path found by a walk must show (:func:`steady`)."""
    errors: list[tuple[str, str]] = field(default_factory=list)
    roots: dict[str, dict[str, RootId]] = field(default_factory=dict)  # per consumer, after a complete walk
    stopped: bool = False
    """The walk was stopped before its end: ``observe`` holds what it met until then, and no path is judged
    gone (that needs the whole tree)."""
    resume: Resume | None = None
    """When stopped: where the next walk goes on (it still walks the whole tree, so it judges deletions)."""


def diff(
    jobs: list[tuple[str, str, bool]],
    views: list[View],
    scopes: list[str] | None,
    forced: bool,
    covered: frozenset[str] | None = None,
    share: tuple[int, int] = (1, 0),
    listings: dict[str, Listing] | None = None,
    stop: threading.Event | None = None,
    recorded: dict[str, Recorded] | None = None,
    resume: Resume | None = None,
    publish: Callable[[str, dict[str, object]], None] | None = None,
) -> Diff:
    """Walk and compare with each consumer's acknowledged fingerprints (blocking).

    The common case, a file whose fingerprint equals its record, costs one dict
    lookup and one tuple comparison; the filter is consulted only for the rest.
    The walk hands its entries over in chunks (:data:`SCAN_CHUNK`), so memory does
    not grow with the tree. With ``covered``, the regular files of those directories
    (on local file systems) not in ``share`` are met without a stat, and with ``listings`` (the
    caller's memo, kept across walks) one unchanged since it was listed is not listed again
    (:class:`Trust`). Paths gone since
    they were acknowledged are found by counting: when every path recorded (under the
    scope) before the walk was met on it, none is gone; otherwise (rare: a delete
    inotify did not report, or one still being handled) the tree is listed once more to
    name them (the types of its entries: no file stat-ed, :func:`~reloadd._pipeline._scan.present`).

    With ``stop``, the walk ends at its next directory (or chunk of a big one) once the event is set:
    the result holds what it met (``Diff.stopped``) and where it stopped (``Diff.resume``). With
    ``resume`` (for the same jobs), the walk goes on from there instead of beginning again, and walks
    what the stopped one had walked last: it still meets every directory once.

    With ``recorded`` (the caller's memo, kept across walks), a consumer's recorded paths under the scope
    are taken from it while its keys are those it was built from (:class:`Recorded`).

    With ``publish``, what a chunk of the walk found to differ is handed to it (consumer, path -> seen) as
    the walk goes, from the walk's thread, and not kept: the result holds only what came after the last
    chunk (the paths judged gone, at the end).
    """
    errors: dict[str, str] = {}
    tops = [top for top, _, _ in jobs]
    overlap = any(i != j and under(a, b) for i, a in enumerate(tops) for j, b in enumerate(tops))
    compares = [_Compare(v, scopes, forced, overlap, recorded) for v in views]

    trust = Trust(covered, local_devices(), *share, listings=listings) if covered else None
    stopped = _walk(jobs, compares, errors, trust, stop, resume, publish)
    if stopped is not None:
        return stopped
    return _judge(jobs, compares, errors, trust.skipped if trust is not None else set())


def _walk(
    jobs: list[tuple[str, str, bool]],
    compares: list[_Compare],
    errors: dict[str, str],
    trust: Trust | None,
    stop: threading.Event | None,
    resume: Resume | None,
    publish: Callable[[str, dict[str, object]], None] | None,
) -> Diff | None:
    """:func:`diff`'s walk: each job scanned, its chunks compared by the consumers whose roots meet it. Returns the
    stopped walk's result (what it met, and where to resume), or ``None`` when the walk went to its end."""
    order, first = list(jobs), None
    if resume is not None and sorted(resume.jobs) == sorted(jobs):
        order, first = list(resume.jobs), list(resume.start)
    for i, (top, root, recursive) in enumerate(order):
        # Only the consumers whose roots meet this walk's top compare its chunks: a path under another
        # consumer's root is not learned (and memoised) as "not mine" by every other consumer, every rescan.
        mine = [c for c in compares if c.meets(top)]
        for c in mine:
            c.scoped = any(under(top, r) for r in c.roots)

        def sink(found: Found, listed: set[str], mine: list[_Compare] = mine) -> None:
            for c in mine:
                c.take(found, listed)
                if publish is not None and c.observe:
                    publish(c.view.name, c.observe)  # what differs so far goes out now, not after the walk
                    c.observe = {}

        found: Found = {}
        listed: set[str] = set()
        try:
            scan(top, root, recursive, found, errors, sink, trust, listed, stop, first if i == 0 else None)
            sink(found, listed)
        except WalkStopped as stopped:  # what it met until then is observed; nothing is judged gone
            sink(found, listed)
            out = Diff(stopped=True, resume=Resume((*order[i:], *order[:i]), (*stopped.done, *stopped.left)))
            for c in compares:
                out.observe[c.view.name] = c.observe
            return out
    return None


def _judge(jobs: list[tuple[str, str, bool]], compares: list[_Compare], errors: dict[str, str],
           skipped: set[str]) -> Diff:
    """:func:`diff`'s verdict once the walk went to its end: each consumer's differences, the errors it owns
    (each path's once), and the paths gone, found by counting (see :func:`diff`); ``skipped``: the directories
    the walk did not list (unchanged since they were)."""
    out = Diff()
    warned: set[str] = set()
    everything: set[str] | None = None
    for c in compares:
        for key, error in errors.items():
            if c.view.owned(key) and key not in warned:
                warned.add(key)
                out.errors.append((key, error))
        expected = c.total()
        c.keep()
        unlisted = {d for d in skipped if c.meets(d)}
        if unlisted:  # the records of a directory not listed (unchanged since it was) are there: not counted
            per_dir = c.per_dir()
            expected -= sum(per_dir.get(d, 0) for d in unlisted)
        if expected == c.met and c.view.guard is not None:
            out.roots[c.view.name] = c.view.guard.root_ids()  # every record met: the roots are the good ones
        if expected != c.met:
            if everything is None:  # which paths are there: listed, not stat-ed (see present)
                everything = set()
                for top, root, recursive in jobs:
                    everything |= present(top, root, recursive)
            for key in c.before:
                if key not in everything:
                    c.observe[key] = None  # gone (or no longer a regular file)
        out.observe[c.view.name] = c.observe
    return out

class _Compare:
    """One consumer's side of a rescan: what to observe, and how many of its records were met."""

    def __init__(self, view: View, scopes: list[str] | None, forced: bool, overlap: bool,
                 recorded: dict[str, Recorded] | None = None) -> None:
        self.view = view
        self.forced = forced
        self._in_order = InOrder(view.records)  # the walk's stats compared with the records in their order first
        self.observe: dict[str, object] = {}  # path -> what the walk saw of it (see Diff.observe)
        self.met = 0
        self.met_keys: set[str] | None = set() if overlap else None  # walks overlap: a path may be met twice
        self.scoped = True  # every path of the walk's current top is under the scope (set per top by diff)
        roots = scopes if scopes is not None else [str(r) for r in view.filter.roots]
        self.roots = frozenset(roots)
        self.prefixes = tuple(r if r.endswith("/") else r + "/" for r in roots)
        # A held removal is taken up again when the walk meets it. A path settling in the aggregator is not
        # observed at all: its probe there comes after this walk's stat, and a burst's walk re-observed
        # every one of up to 100,000 settling paths (a second of CPU, the last delivery later).
        self.held = view.prune_held
        # The recorded paths under the scope: one atomic copy of the keys (references, not new strings),
        # filtered once so a path met on the walk costs one set lookup. A held removal is not counted:
        # missing, it stays held; met, it is taken up through ``held``. A path queued or in flight as a
        # file counts too: deleted while its removal event was lost (an overflow), it would be recorded
        # after the walk for a file no longer there. Not built while the counts kept across walks stand for
        # the records (:class:`Recorded`: the consumer's keys are the same, nothing queued): a recorded path
        # the walk meets is then counted in C (:meth:`take`), and an idle rescan never goes over every record.
        self._pending = view.pending()
        self._before: set[str] | None = None
        self._counts: tuple[int, dict[str, int]] | None = None  # (paths in scope, per directory)
        self._recorded = recorded
        self._keep_as: tuple[int, tuple[str, ...]] | None = None
        scope = tuple(sorted(self.roots))
        # Nothing queued: the counts are the records' alone, and their version says whether they moved.
        version = view.keys_version if recorded is not None and not self._pending else None
        memo = recorded.get(view.name) if version is not None and recorded is not None else None
        if memo is not None and (memo.version, memo.scope, memo.held) == (version, scope, view.prune_held):
            self._counts = (memo.total, memo.per_dir)
            return
        _ = self.before  # as the walk starts
        # The version was read on the loop before the walk, the keys here after it: kept for that version
        # only (a key added or dropped since moves the version, and the memo is never taken again).
        self._keep_as = (version, scope) if version is not None else None

    def keep(self) -> None:
        """Remember this walk's counts for the next (:class:`Recorded`), when they may be."""
        if self._keep_as is not None and self._recorded is not None:
            version, scope = self._keep_as
            self._recorded[self.view.name] = Recorded(version, scope, self.view.prune_held, self.total(),
                                                      self.per_dir())

    @property
    def before(self) -> set[str]:
        """The recorded (and queued) paths under the scope (built at the first use)."""
        if self._before is None:
            keys = [*self.view.records, *self._pending]  # one atomic copy of the keys (references)
            # Filtered in C (100,000 keys: ~15 ms, against ~35 for a comprehension): under a root, or a root.
            before = set(itertools.compress(keys, map(str.startswith, keys, itertools.repeat(self.prefixes))))
            before.update(self.roots.intersection(keys))
            before.difference_update(self.view.prune_held)
            self._before = before
            self._counts = None  # counted from these keys from now on, read later than the memo's
        return self._before

    def total(self) -> int:
        """How many paths :attr:`before` holds."""
        return self._counts[0] if self._counts is not None else len(self.before)

    def per_dir(self) -> dict[str, int]:
        """How many paths of :attr:`before` each directory holds (the key's parent)."""
        if self._counts is None:
            per_dir: dict[str, int] = {}
            for key in self.before:
                d = key[:key.rfind("/")] or "/"
                per_dir[d] = per_dir.get(d, 0) + 1
            self._counts = (len(self.before), per_dir)
        return self._counts[1]

    def meets(self, top: str) -> bool:
        """Whether a walk of ``top`` can meet a path of this consumer (one of its roots is above or below it)."""
        return any(under(top, r) or under(r, top) for r in self.view.filter.roots)

    def take(self, found: Found, listed: set[str]) -> None:
        """Compare one chunk of a walk: ``found`` stat-ed, ``listed`` met in covered directories (no stat)."""
        owned, queued, held, observe = self.view.owned, self.view.queued, self.held, self.observe
        if not found and not listed:
            return
        recorded, differing = self._in_order.mismatches(found) if found else (0, [])
        if self._before is None and self.met_keys is None and self.scoped:
            # The kept counts stand for the records: a recorded path met is one the counts hold (a record
            # added while the walk runs may be counted too; that only defers to the next walk the judgement
            # of a record gone without its event). Counted as the chunk is compared (listed ones in C), no set
            # of every recorded path built.
            n = recorded + (sum(map(self.view.records.__contains__, listed)) if listed else 0)
            if held:
                n -= len(held.intersection(found)) + len(held.intersection(listed))
            self.met += n
        else:
            met = self.before.intersection(found)  # in C: the recorded paths this chunk met
            if listed:
                met |= self.before.intersection(listed)
            if self.met_keys is not None:
                met -= self.met_keys
                self.met_keys |= met
            self.met += len(met)
        if self.forced:
            for key, fp in found.items():  # a forced walk trusts nothing: ``listed`` is empty
                if owned(key):
                    observe[key] = fp
            return
        name, settling = self.view.name, self.view.settling
        if listed:
            # A covered directory's watch reports every change of its files: only a file never
            # acknowledged (or one held) needs a look. Both found in C, not per listed path.
            for key in listed.difference(self.view.records):
                if queued(key, _MISSING) is _MISSING and not settling((name, key)) and owned(key):
                    observe[key] = UNSEEN
            if held:
                for key in held.intersection(listed):
                    if owned(key):
                        observe[key] = UNSEEN
        if held:
            for key in held.intersection(found):
                if owned(key):
                    observe[key] = found[key]  # a held removal's file is there (as acknowledged or not): taken up
        for key in differing:  # the walk's stat differs from the record's (or there is none)
            if held and key in held:
                continue
            fp = found[key]  # the walk's stat, packed
            if (not steady(fp, cast("Fingerprint | None", queued(key, None))) and not settling((name, key))
                    and owned(key)):
                observe[key] = fp  # differs from what was acknowledged and what is queued, and is not settling


_MISSING: object = object()
