"""What each file put in the cluster, and the fields reloadd owns there: the Kubernetes drift judge.

Server-side apply records, per object, the fields each field manager owns (``metadata.managedFields``).
When another manager changes a field reloadd applied (``kubectl edit``, ``kubectl patch``, another
controller), the server moves that field to the other manager: reloadd's own entry (its manager,
operation ``Apply``) loses it. So the drift test needs no request and no copy of the manifest: an
object whose reloadd entry differs from the one its last apply answered is drifted, and a member
deleted (or relabelled out of its set) is drifted. A label another manager adds changes only the
other manager's entry: not drift. reloadd's own applies set the baseline from their answers.

The ledger keeps, per member object, its file, the ApplySet, the hash of reloadd's fields (persisted in
the file's record, as ``owned``) and, once applied by this process, the fields themselves (to name
what changed) and the answer's ``resourceVersion``. Events about a file being applied are stashed and
judged once the apply answered, so an apply's own event is never drift; an event older than the
apply's answer (a smaller resourceVersion, as etcd numbers them) is stale.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reloadd import Drift, PathRecord

from ._applyset import ObjRef
from ._discovery import split_api_version
from ._outcome import applyset_of

__all__ = ["Ledger", "Member", "field_paths", "owned_entry", "owned_hash"]

_MAX_KEPT_FIELDS = 16 << 10
"""Bytes of reloadd's fields kept in memory per object (to name what changed); larger ones keep only the hash."""


def owned_entry(obj: Mapping[str, Any], manager: str) -> Mapping[str, Any] | None:
    """The ``fieldsV1`` of ``manager``'s ``Apply`` entry of ``obj`` (``None``: it owns nothing there)."""
    meta = obj.get("metadata") or {}
    for entry in meta.get("managedFields") or ():
        if (isinstance(entry, Mapping) and entry.get("manager") == manager and entry.get("operation") == "Apply"
                and not entry.get("subresource")):
            fields = entry.get("fieldsV1")
            return fields if isinstance(fields, Mapping) else {}
    return None


def owned_hash(obj: Mapping[str, Any], manager: str) -> str | None:
    """A short stable hash of what ``manager`` owns in ``obj`` (``None``: nothing)."""
    fields = owned_entry(obj, manager)
    if fields is None:
        return None
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _segment(key: str) -> str:
    kind, _, rest = key.partition(":")
    if kind == "f":
        return rest
    if kind == "k":
        try:
            keys = json.loads(rest)
        except ValueError:
            return f"[{rest}]"
        return "[" + ",".join(f"{k}={v}" for k, v in sorted(keys.items())) + "]"
    if kind == "i":
        return f"[{rest}]"
    if kind == "v":
        return f"[={rest}]"
    return key


def field_paths(fields: Mapping[str, Any], prefix: str = "") -> set[str]:
    """The leaf fields of a ``fieldsV1`` tree as dotted paths (``data.v``, ``spec.containers[name=app].image``)."""
    out: set[str] = set()
    for key, sub in fields.items():
        if key == ".":
            continue
        seg = _segment(key)
        path = f"{prefix}{'' if seg.startswith('[') or not prefix else '.'}{seg}"
        children = {k: v for k, v in (sub or {}).items() if k != "."} if isinstance(sub, Mapping) else {}
        if children:
            out |= field_paths(children, path)
        else:
            out.add(path)
    return out


def other_manager(obj: Mapping[str, Any], manager: str) -> str:
    """The manager (and operation) that wrote ``obj`` last, other than ``manager``; ``""`` if none."""
    entries = [e for e in (obj.get("metadata") or {}).get("managedFields") or ()
               if isinstance(e, Mapping) and e.get("manager") != manager]
    if not entries:
        return ""
    last = max(entries, key=lambda e: str(e.get("time") or ""))
    op = last.get("operation")
    return f"{last.get('manager') or '?'}" + (f" ({op})" if op else "")


def _rv(value: Any) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


@dataclass
class Member:
    """One object a file applied.

    Attributes:
        path: The file.
        applyset: Its ApplySet id.
        owned: Hash of reloadd's fields after the last apply (``None``: not known yet; the first
            sighting sets it).
        fields: Those fields, when this process applied it (to name what changed).
        rv: The ``resourceVersion`` of that apply's answer, if numeric.
    """

    path: Path
    applyset: str
    owned: str | None = None
    fields: Mapping[str, Any] | None = None
    rv: int | None = None


@dataclass
class Ledger:
    """Members of every file and the drift test (see the module).

    Attributes:
        manager: reloadd's field manager.
        on_change: Called when the set of watched kinds and namespaces may have changed.
    """

    manager: str
    on_change: Callable[[], None] = lambda: None
    members: dict[ObjRef, Member] = field(default_factory=dict)
    _by_path: dict[Path, set[ObjRef]] = field(default_factory=dict)
    _busy: dict[Path, int] = field(default_factory=dict)
    _stash: dict[ObjRef, tuple[str, Mapping[str, Any]]] = field(default_factory=dict)

    # --- membership ----------------------------------------------------------------------------------
    def load(self, records: Iterable[tuple[Path, PathRecord]]) -> list[Path]:
        """Members from the records (their ``owned``); returns the recorded files that have none (applied
        by an older reloadd: a forced pass records them)."""
        bare: list[Path] = []
        for path, rec in records:
            data = rec.data if isinstance(rec.data, dict) else None
            if data is None or data.get("skipped"):
                continue
            applyset = applyset_of(data)
            if applyset is None:
                continue
            owned = data.get("owned")
            if not isinstance(owned, dict):
                bare.append(path)
                continue
            refs = {}
            for text, digest in owned.items():
                try:
                    refs[ObjRef.parse(text)] = digest if isinstance(digest, str) else None
                except ValueError:
                    continue
            self._set(path, applyset, {r: (h, None, None) for r, h in refs.items()})
        self.on_change()
        return bare

    def _set(self, path: Path, applyset: str,
             refs: Mapping[ObjRef, tuple[str | None, Mapping[str, Any] | None, int | None]]) -> None:
        for ref in self._by_path.pop(path, set()):
            m = self.members.get(ref)
            if m is not None and m.path == path:
                del self.members[ref]
        for ref, (digest, fields, rv) in refs.items():
            old = self.members.get(ref)
            if old is not None and old.path != path:
                self._by_path.get(old.path, set()).discard(ref)
            self.members[ref] = Member(path, applyset, digest, fields, rv)
        if refs:
            self._by_path[path] = set(refs)

    def applied(self, path: Path, applyset: str, answers: Mapping[ObjRef, Mapping[str, Any]]) -> dict[str, str]:
        """``path`` was applied: its members are the objects the server answered for (``answers``).

        Returns ``owned`` for the file's record (object → hash of reloadd's fields).
        """
        refs: dict[ObjRef, tuple[str | None, Mapping[str, Any] | None, int | None]] = {}
        for ref, obj in answers.items():
            fields = owned_entry(obj, self.manager)
            if fields is not None and len(json.dumps(fields, separators=(",", ":"))) > _MAX_KEPT_FIELDS:
                fields = None  # a CRD's schema: too big to keep per object only to name what changed
            refs[ref] = (owned_hash(obj, self.manager), fields, _rv((obj.get("metadata") or {}).get("resourceVersion")))
        self._set(path, applyset, refs)
        self.on_change()
        return {str(r): h for r, (h, _f, _rv) in sorted(refs.items()) if h is not None}

    def removed(self, path: Path) -> None:
        """``path``'s objects were removed (or are no longer reloadd's to guard)."""
        self._set(path, "", {})
        self.on_change()

    def kinds(self) -> set[tuple[str, str, str]]:
        """``(group, kind, namespace)`` of every member: what the watches must cover."""
        return {(r.group, r.kind, r.namespace) for r in self.members}

    def expected(self, group: str, kind: str, namespace: str) -> list[ObjRef]:
        """The members of one kind in one namespace (``""``: cluster-scoped, or every namespace)."""
        return [r for r in self.members if r.group == group and r.kind == kind
                and (not namespace or r.namespace == namespace)]

    def applied_after(self, ref: ObjRef, resource_version: str) -> bool:
        """Whether reloadd's apply of the member ``ref`` answered at a later resourceVersion than
        ``resource_version`` (a list's): that list was taken before the apply, so it cannot show the object."""
        m = self.members.get(ref)
        rv = _rv(resource_version)
        return m is not None and m.rv is not None and rv is not None and m.rv > rv

    # --- in flight -----------------------------------------------------------------------------------
    def begin(self, path: Path) -> None:
        """``path`` is being applied or removed: events about its members wait for the answer."""
        self._busy[path] = self._busy.get(path, 0) + 1

    def end(self, path: Path) -> list[tuple[Path, Drift]]:
        """The apply of ``path`` answered: the stashed events about its members, judged now."""
        n = self._busy.get(path, 0) - 1
        if n > 0:
            self._busy[path] = n
            return []
        self._busy.pop(path, None)
        out = []
        for ref in [r for r, (_t, _o) in self._stash.items() if self._stash_path(r) in (path, None)]:
            kind, obj = self._stash.pop(ref)
            got = self.judge(kind, ref, obj)
            if got is not None:
                out.append(got)
        return out

    def _stash_path(self, ref: ObjRef) -> Path | None:
        m = self.members.get(ref)
        return m.path if m is not None else None

    # --- judging -------------------------------------------------------------------------------------
    def judge(self, kind: str, ref: ObjRef, obj: Mapping[str, Any] | None) -> tuple[Path, Drift] | None:
        """The file to correct and what drifted, for one watch event (``DELETED`` with ``obj`` or not)."""
        m = self.members.get(ref)
        if m is None:
            return None  # not a member of any file (another tool's ApplySet, or pruned)
        if m.path in self._busy:
            if obj is not None:
                self._stash[ref] = (kind, obj)
            return None
        what = f"{ref.group_kind} {ref.namespace + '/' if ref.namespace else ''}{ref.name}"
        meta = (obj or {}).get("metadata") or {}
        rv = _rv(meta.get("resourceVersion"))
        if kind == "DELETED":
            if rv is not None and m.rv is not None and rv <= m.rv:
                return None  # an old incarnation, replaced by reloadd's apply
            return m.path, Drift("object", what, "deleted (or its ApplySet label removed)")
        if obj is None or (rv is not None and m.rv is not None and rv <= m.rv):
            return None  # reloadd's own apply, or older than it
        live = owned_hash(obj, self.manager)
        if live is None:
            return m.path, Drift("object", what, "reloadd's fields were taken over or removed",
                                 other_manager(obj, self.manager))
        if m.owned is None:
            m.owned = live  # first sighting since an old record: the baseline
            return None
        if live == m.owned:
            return None
        lost = sorted(field_paths(m.fields) - field_paths(owned_entry(obj, self.manager) or {})) if m.fields else []
        why = (f"{', '.join(lost[:3])}{' ...' if len(lost) > 3 else ''} changed" if lost
               else "fields reloadd applies changed")
        return m.path, Drift("object", what, why, other_manager(obj, self.manager))


def ref_of(group: str, kind: str, obj: Mapping[str, Any]) -> ObjRef:
    """The :class:`ObjRef` of a listed or watched object of a known group and kind."""
    meta = obj.get("metadata") or {}
    api_version = obj.get("apiVersion")
    if isinstance(api_version, str) and api_version:
        group = split_api_version(api_version)[0]
    return ObjRef(group, str(obj.get("kind") or kind), str(meta.get("namespace") or ""), str(meta.get("name") or ""))
