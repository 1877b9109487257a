"""Records are kept packed, one untracked ``bytes`` a path: what a consumer reads back is what it acknowledged."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from reloadd import Fingerprint, PathRecord
from reloadd._pipeline import _item
from reloadd._pipeline._inorder import InOrder
from reloadd._pipeline._item import path_of
from reloadd._state._packed import (
    digest_of,
    journal_json,
    pack_record,
    pack_stat,
    stat_of,
    unpack,
    unpack_stat,
)
from reloadd._state._records import _VERSION, RecordStore, _snapshot_chunks

_ints = st.integers(min_value=0, max_value=2**63 - 1)
_times = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**53), max_value=2**53) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
_records = st.builds(
    PathRecord,
    fingerprint=st.none() | st.builds(Fingerprint, _ints, _ints, _times, _times),
    digest=st.none() | st.text(alphabet="0123456789abcdef", min_size=64, max_size=64) | st.text(),
    data=_json,
    error=st.none() | st.text(),
)


@given(st.lists(st.tuples(_records, st.sampled_from(["same", "no record", *Fingerprint._fields]),
                          st.builds(Fingerprint, _ints, _ints, _times, _times)), max_size=12))
def test_a_walk_is_told_which_stats_differ_from_the_records(cases) -> None:
    """A rescan hands over exactly the files whose stat is not the fingerprint their record holds."""
    records: dict[str, bytes] = {}
    found: dict[str, bytes] = {}
    for i, (rec, how, other) in enumerate(cases):
        key = f"/w/f{i}"
        if how != "no record":
            records[key] = pack_record(rec)
        seen = other
        if rec.fingerprint is not None and how != "no record":  # the record's own, or one field of it moved
            seen = rec.fingerprint if how == "same" else rec.fingerprint._replace(**{how: getattr(other, how)})
        found[key] = pack_stat(*seen)
    records["/w/not-met"] = pack_record(PathRecord(Fingerprint(1, 2, 3, 4), None))
    # No fingerprint, and a digest whose raw bytes sit where one would and read as the stat found.
    found["/w/digest-only"] = pack_stat(5, 6, 7, 8)
    records["/w/digest-only"] = pack_record(PathRecord(None, found["/w/digest-only"].hex()))
    recorded, differing = InOrder(records).mismatches(found)
    assert recorded == len(records) - 1
    assert "/w/digest-only" in differing
    assert differing == [k for k in found
                         if k not in records or unpack(records[k]).fingerprint != Fingerprint(*unpack_stat(found[k]))]


@given(_records)
def test_a_record_reads_back_as_it_was_put(rec: PathRecord) -> None:
    raw = pack_record(rec)
    assert unpack(raw) == rec
    assert stat_of(raw) == rec.fingerprint
    assert digest_of(raw) == rec.digest
    # The state files hold exactly what json.dumps gives for the record's fields.
    fields = {"fp": list(rec.fingerprint) if rec.fingerprint is not None else None, "digest": rec.digest,
              "data": rec.data, "error": rec.error}
    assert json.loads(journal_json(raw)) == {k: v for k, v in fields.items() if v is not None}


_hexish = (st.text(alphabet="0123456789abcdefABCDEF", min_size=64, max_size=64).filter(lambda t: t != t.lower())
           | st.text(alphabet="0123456789abcdef ", min_size=64, max_size=64).filter(lambda t: " " in t)
           | st.text(alphabet="0123456789abcdef", min_size=62, max_size=66))


@given(st.builds(Fingerprint, _ints, _ints, _times, _times),
       st.text(alphabet="0123456789abcdef", min_size=64, max_size=64) | _hexish | st.text())
@example(Fingerprint(1, 2, -3, 4), 'md5:"caf\u00e9"\\')  # a digest text JSON must escape
def test_an_acknowledged_path_is_recorded_and_journaled_in_the_state_format(fp, digest) -> None:
    """The common record (a fingerprint and a digest, nothing else: a burst's every path) takes a shorter way
    through the encoders; the record is byte for byte the layout the module documents and the journal line the
    exact text ``json.dumps`` gives, for a digest that is not lower-case hex (upper case, spaces, another
    length) too, and both read back the same."""
    import struct
    import tempfile

    sha = len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
    text = digest.encode("utf-8", "surrogateescape")
    expected = (bytes((1 | (2 if sha else 4),)) + struct.pack("<QQqq", *fp)
                + (bytes.fromhex(digest) if sha else struct.pack("<I", len(text)) + text))
    with tempfile.TemporaryDirectory() as tmp:
        store = RecordStore(Path(tmp) / "state")
        store.load()
        key = '/srv/m\u00e9 "x".yaml'
        store.set_json(key, fp, digest, None)
        assert store.packed[key] == expected
        assert store._buffer == [json.dumps({"p": key, "r": {"fp": list(fp), "digest": digest}},
                                            separators=(",", ":"))]
        store.flush()
        again = RecordStore(Path(tmp) / "state")
        again.load()
        assert again.by_str[key] == PathRecord(fp, digest, None, None)
        again.compact()  # the snapshot's text, as json.dumps gives it, and read back
        snapshot = (Path(tmp) / "state" / "records.json").read_text()
        assert snapshot.endswith(json.dumps({key: {"fp": list(fp), "digest": digest}}, separators=(",", ":"))[1:] + "}")
        third = RecordStore(Path(tmp) / "state")
        third.load()
        assert third.by_str[key] == PathRecord(fp, digest, None, None)


@given(st.lists(_records, max_size=40), st.integers(min_value=1, max_value=7))
def test_a_snapshot_is_the_text_json_dumps_gives_for_every_kind_of_record(recs, per_chunk) -> None:
    """A compaction writes, whatever the records hold and however they are chunked, the document ``json.dumps``
    gives (the common record takes a shorter way through the encoder)."""
    records = [(f'/w/d "{i}"/f\u00e9{i}', pack_record(r)) for i, r in enumerate(recs)]
    text = b"".join(_snapshot_chunks(3, records, per_chunk)).decode()
    members = {}
    for (key, _), r in zip(records, recs, strict=True):
        fields = {"fp": list(r.fingerprint) if r.fingerprint is not None else None, "digest": r.digest,
                  "data": r.data, "error": r.error}
        members[key] = {k: v for k, v in fields.items() if v is not None}
    assert text == json.dumps({"version": _VERSION, "gen": 3, "records": members}, separators=(",", ":"))


def test_records_survive_a_restart_and_are_not_tracked_by_the_collector(tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "state")
    store.load()
    fp = Fingerprint(7, 3, 1_700_000_000_000_000_000, 1_700_000_000_500_000_000)
    store.set("/srv/a.yaml", fp, "ab" * 32, {"applied": ["ConfigMap/x"]})
    store.put(Path("/srv/b.yaml"), PathRecord(fp, None, None, "bad: line 3"))
    store.flush()
    again = RecordStore(tmp_path / "state")
    again.load()
    assert again[Path("/srv/a.yaml")] == PathRecord(fp, "ab" * 32, {"applied": ["ConfigMap/x"]}, None)
    assert again.by_str["/srv/b.yaml"].error == "bad: line 3"
    assert list(again.errors()) == [("/srv/b.yaml", "bad: line 3")]
    assert again.rejected() == 1
    # What 100,000 paths cost a full collection: nothing per record.
    assert not any(gc.is_tracked(raw) for raw in again.packed.values())
    again.compact()
    third = RecordStore(tmp_path / "state")
    third.load()
    assert dict(third.by_str) == dict(again.by_str)


def test_a_mass_removal_gives_the_table_back_and_keeps_every_record(tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "state")
    store.load()
    live = store.packed  # what the engine's walks read: it must stay the live table
    fp = Fingerprint(7, 3, 1_700_000_000_000_000_000, 1_700_000_000_500_000_000)
    version = store.keys_version
    for i in range(20_000):
        store.set(f"/srv/{i}.yaml", fp, "ab" * 32)
    assert store.keys_version > version
    version = store.keys_version
    store.set("/srv/0.yaml", fp._replace(size=4), "cd" * 32)  # replaced, not added: the keys are the same
    assert store.keys_version == version
    full = sys.getsizeof(live)
    for i in range(19_000):
        store.drop(f"/srv/{i}.yaml")
    assert store.keys_version > version
    assert sys.getsizeof(live) == full  # a dict never shrinks by itself...
    store.shrink()  # ...the engine has it rebuilt when idle
    assert sys.getsizeof(live) < full / 4
    assert len(live) == 1_000 and live is store.packed
    store.flush()
    again = RecordStore(tmp_path / "state")
    again.load()
    assert dict(again.by_str) == dict(store.by_str)
    assert again.by_str["/srv/19999.yaml"] == PathRecord(fp, "ab" * 32)


def test_removing_half_of_the_paths_gives_half_the_table_back(tmp_path: Path) -> None:
    """The delete burst of the fast-writer bench: 100,000 of 200,000 paths removed (here 10,001 of 20,000)."""
    store = RecordStore(tmp_path / "state")
    fp = Fingerprint(7, 3, 1_700_000_000_000_000_000, 1_700_000_000_500_000_000)
    for i in range(20_000):
        store.set(f"/srv/{i}.yaml", fp, "ab" * 32)
    full = sys.getsizeof(store.packed)
    for i in range(10_001):
        store.drop(f"/srv/{i}.yaml")
    store.shrink()
    assert sys.getsizeof(store.packed) <= full * 0.6
    assert len(store.packed) == 9_999 and store.by_str["/srv/19999.yaml"] == PathRecord(fp, "ab" * 32)


def test_path_of_is_the_path() -> None:
    for key in ["/", "/a", "/srv/reloadd/images/app.tar", "/a/.hidden", "/a/b.", "/a/..b", "/a/../b", "/a/./b",
                "//a/b", "/a//b", "/a/b/", "/a/.", "relative/x", "/a b/c\u00e9", "/a/b\udcff"]:
        got = path_of(key)
        want = Path(key)
        assert got == want and str(got) == str(want) and got.parts == want.parts, key
        assert hash(got) == hash(want) and got.name == want.name and got.parent == want.parent, key


async def test_data_that_is_not_json_is_named_and_the_acknowledgement_kept(tmp_path, caplog):
    from reloadd import Ack, BaseConsumer, ConsumerContext, Reloader, parse_config

    root = tmp_path / "root"
    root.mkdir()
    (root / "a.conf").write_text("a")
    handed: list[Path] = []

    class SetData(BaseConsumer):
        async def handle(self, batch):
            handed.extend(c.path for c in batch.changes)
            return {c.path: Ack({"refs": {1, 2}}) for c in batch.changes}  # a set: not JSON

    consumer = SetData(ConsumerContext(name="c", paths=(root,), options={}, state_dir=tmp_path / "cs"))
    cfg = parse_config({"reloadd": {"state_dir": "", "quiet": "50ms"}})
    async with Reloader(cfg, consumers=[consumer]) as r:
        await r.wait_idle(10)
        record = r.engine.slots["c"].records.get(str(root / "a.conf"))
        assert record is not None and record.data is None and record.fingerprint is not None
        r.trigger()
        await r.wait_idle(10)
    assert handed == [root / "a.conf"] * 2  # acknowledged: not handed over again until asked
    assert any("a.conf" in m and "not JSON" in m for m in caplog.messages)


@pytest.mark.skipif(not _item._PARTS_SET, reason="Python 3.11's pathlib: later ones build a Path lazily themselves")
def test_a_batch_of_paths_costs_little_memory() -> None:
    """A batch in flight holds a ``Path`` a path: the paths of a directory share its part strings, and a path's
    string is its key (asked for by a consumer, it is not joined again)."""
    import tracemalloc

    keys = [f"/srv/reloadd/manifests/app/f{i:05d}.yaml" for i in range(2048)]
    path_of(keys[0])  # the directory's parts, once
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        paths = [path_of(k) for k in keys]
        strings = [str(p) for p in paths]
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert all(s is k for s, k in zip(strings, keys, strict=True))
    assert used / len(keys) < 360, used / len(keys)  # 268 bytes; a split of each path, joined again: 621
