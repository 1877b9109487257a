"""A walk's stats are compared with the records in the records' own order, with the answers of a lookup each."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from reloadd import Fingerprint, PathRecord
from reloadd._pipeline._inorder import MISSES, InOrder
from reloadd._state._packed import pack_record, pack_stat, unpack, unpack_stat


class Counting(dict[str, bytes]):
    """Records that count the lookups made in them."""

    lookups = 0

    def get(self, key: str, default: Any = None) -> Any:
        self.lookups += 1
        return super().get(key, default)


def _record(i: int) -> bytes:
    return pack_record(PathRecord(Fingerprint(i, 10, 20, 30), "ab" * 32))


def _stat(i: int, moved: bool = False) -> bytes:
    return pack_stat(i, 11 if moved else 10, 20, 30)


def _lookup_each(records: dict[str, bytes], found: dict[str, bytes]) -> tuple[int, list[str]]:
    """The answers of a lookup a path, read through ``unpack`` (not the packed-byte comparison under test)."""
    differing = [k for k in found
                 if k not in records or unpack(records[k]).fingerprint != Fingerprint(*unpack_stat(found[k]))]
    return sum(1 for k in found if k in records), differing


def _tree(n: int) -> Counting:
    records = Counting()
    for i in range(n):
        records[f"/w/d{i // 100}/f{i:05d}"] = _record(i)
    return records


def _walk(keys: list[str], records: dict[str, bytes], chunk: int = 4096) -> list[dict[str, bytes]]:
    """The chunks of a walk meeting ``keys`` in that order, each file at its recorded stat (new ones at another)."""
    out: list[dict[str, bytes]] = []
    for at in range(0, len(keys), chunk):
        out.append({k: _stat(int(k[-5:])) if k in records else _stat(1 << 40) for k in keys[at:at + chunk]})
    return out


def _compare(records: dict[str, bytes], chunks: list[dict[str, bytes]]) -> tuple[int, list[str]]:
    cursor = InOrder(records)
    recorded, differing = 0, []
    for found in chunks:
        want = _lookup_each(dict(records), found)  # a plain dict: the lookups counted are the cursor's
        got = cursor.mismatches(found)
        assert got == want
        recorded += got[0]
        differing += got[1]
    return recorded, differing


def test_an_unchanged_tree_met_in_its_order_is_compared_without_a_lookup() -> None:
    records = _tree(10_000)
    assert _compare(records, _walk(list(records), records)) == (10_000, [])
    assert records.lookups == 0


def test_files_added_and_removed_cost_a_few_lookups() -> None:
    records = _tree(10_000)
    keys = list(records)
    walk = [*keys[:3000], "/w/d30/new-a", *keys[3000:5000], *keys[5003:], "/w/d99/new-b"]  # 2 added, 3 gone
    recorded, differing = _compare(records, _walk(walk, records))
    assert (recorded, differing) == (10_000 - 3, ["/w/d30/new-a", "/w/d99/new-b"])
    assert records.lookups <= 6


def test_a_walk_in_another_order_looks_each_path_up_and_gives_the_cursor_up() -> None:
    records = _tree(5_000)
    keys = list(records)
    random.Random(4).shuffle(keys)
    cursor = InOrder(records)
    assert cursor.mismatches({k: _stat(int(k[-5:])) for k in keys}) == (5_000, [])
    assert records.lookups >= 5_000 - MISSES  # the few met at the cursor by chance are not looked up
    assert cursor._pair is None and not cursor._ahead  # given up: no reading ahead for every path any more


def test_records_changed_while_the_walk_runs_are_read_as_they_are_now() -> None:
    records = _tree(3_000)
    keys = list(records)
    cursor = InOrder(records)
    assert cursor.mismatches({k: _stat(int(k[-5:])) for k in keys[:1000]}) == (1000, [])
    records[keys[1500]] = pack_record(PathRecord(Fingerprint(1500, 11, 20, 30), None))  # replaced in place
    assert cursor.mismatches({k: _stat(int(k[-5:]), moved=True) for k in keys[1000:1600]})[1] == [
        k for k in keys[1000:1600] if k != keys[1500]]
    del records[keys[2000]]  # one fewer: the cursor is given up, lookups from here on
    records["/w/late-00007"] = _record(7)
    rest = {k: _stat(int(k[-5:])) for k in [*keys[1600:], "/w/late-00007"]}
    assert cursor.mismatches(rest) == _lookup_each(records, rest)


_ops = st.lists(st.tuples(st.sampled_from(["keep", "add", "drop", "swap", "moved"]), st.integers(0, 10**6)),
                max_size=60)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 300), ops=_ops, chunk=st.integers(1, 64))
def test_the_answers_are_those_of_a_lookup_each_whatever_the_order(n: int, ops: list[tuple[str, int]],
                                                                   chunk: int) -> None:
    records = _tree(n)
    walk = list(records)
    moved: set[str] = set()
    for op, at in ops:  # files added, removed, met out of turn, changed since recorded
        i = at % (len(walk) + 1)
        if op == "add":
            walk.insert(i, f"/w/new/{at:05d}")
        elif op == "drop" and walk:
            walk.pop(i % len(walk))
        elif op == "swap" and len(walk) > 1:
            j = (i + 1 + at % 5) % len(walk)
            walk[i % len(walk)], walk[j] = walk[j], walk[i % len(walk)]
        elif op == "moved" and walk:
            moved.add(walk[i % len(walk)])
    walk = list(dict.fromkeys(walk))
    chunks = []
    for at in range(0, len(walk), chunk):
        chunks.append({k: _stat(int(k[-5:]), moved=k in moved) for k in walk[at:at + chunk]})
    recorded, differing = _compare(records, chunks)
    assert recorded == sum(1 for k in walk if k in records)
    assert differing == [k for k in walk if k not in records or k in moved]
