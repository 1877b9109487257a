"""Pure parts: the aggregator's settle rules, config validation, filters, state files, the API."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import reloadd
from reloadd import ConfigError, Fingerprint, PathFilter, PathRecord, parse_duration
from reloadd._config import load_config
from reloadd._pipeline._aggregator import Aggregator, Timing
from reloadd._state._atomic import atomic_write
from reloadd._state._packed import pack_stat
from reloadd._state._records import RecordStore
from reloadd._types import Reason

K = ("c", Path("/r/f"))
FP1 = Fingerprint(1, 10, 100, 100)
FP2 = Fingerprint(1, 20, 200, 200)


def agg() -> Aggregator:
    return Aggregator(default=Timing(quiet=0.2, max_delay=5.0))


def test_quiet_period_restarts_on_each_event():
    a = agg()
    a.observe(K, 0.0, reason=Reason.INOTIFY, writing=False)
    a.observe(K, 0.15, reason=Reason.INOTIFY, writing=False)
    assert a.due(0.3) == []
    assert a.due(0.35) == [K]
    assert a.probed(K, FP1, 0.35) is not None
    assert len(a) == 0


def test_a_file_moved_into_place_is_due_at_once_unless_more_happened_to_it():
    a = Aggregator(default=Timing(quiet=0.2, max_delay=5.0, at_once=True))
    a.observe(K, 1.0, reason=Reason.INOTIFY, writing=False, arrived=True)
    assert a.due(1.0) == [K]  # complete as it arrived: no quiet period to wait out
    a.requeue(K, 1.0)  # the probe could not decide: a quiet period as ever
    assert a.due(1.1) == [] and a.due(1.2) == [K]
    b = ("c", Path("/r/g"))
    a.observe(b, 2.0, reason=Reason.INOTIFY, writing=False, arrived=True)
    a.observe(b, 2.01, reason=Reason.INOTIFY, writing=None)  # then a chmod: wait for it to go quiet
    assert a.due(2.1) == [] and a.due(2.21) == [b]
    c = ("c", Path("/r/h"))
    a.observe(c, 3.0, reason=Reason.INOTIFY, writing=True)
    a.observe(c, 3.01, reason=Reason.INOTIFY, writing=False, arrived=True)  # written, then moved over it
    assert a.due(3.1) == [] and a.due(3.21) == [c]


def test_a_file_moved_into_place_waits_the_quiet_period_for_a_consumer_without_at_once():
    a = agg()  # files that go together (a key and its certificate) are gathered by the quiet period
    a.observe(K, 1.0, reason=Reason.INOTIFY, writing=False, arrived=True)
    assert a.due(1.1) == [] and a.due(1.2) == [K]


def test_a_walks_stat_is_the_first_of_the_two_probes_that_settle_a_path():
    a = agg()
    found = pack_stat(*FP1)  # what a walk keeps of a path it found (packed until the probe)
    a.observe(K, 0.0, reason=Reason.RESCAN, verify=True, seen=found)
    assert a.due(0.2) == [K]
    assert a.probed(K, FP1, 0.2) is not None  # the probe agrees with the walk: settled, handed over
    a.observe(K, 1.0, reason=Reason.RESCAN, verify=True, seen=found)
    assert a.due(1.2) == [K]
    assert a.probed(K, FP2, 1.2) is None  # it moved on since the walk: another quiet period
    assert a.due(1.4) == [K] and a.probed(K, FP2, 1.4) is not None
    a.observe(K, 2.0, reason=Reason.RESCAN, verify=True, seen=found)
    assert a.due(2.2) == [K] and a.probed(K, None, 2.2) is None  # gone since the walk: looked at once more


def test_a_walks_finding_taken_in_later_is_due_a_quiet_period_after_the_walk():
    a = agg()
    found = pack_stat(*FP1)
    a.observe(K, 5.0, reason=Reason.RESCAN, verify=True, seen=found, since=1.0)  # walked at 1.0, taken in at 5.0
    assert a.due(5.0) == [K] and a.probed(K, FP1, 5.0) is not None  # the quiet period ran out long ago
    a.observe(K, 6.0, reason=Reason.INOTIFY, writing=False)  # held already when the walk's finding comes in:
    a.observe(K, 6.1, reason=Reason.RESCAN, verify=True, seen=found, since=1.0)
    assert a.due(6.1) == [] and a.due(6.2) == [K]  # its own quiet period, as an event set it


def test_max_delay_caps_a_path_that_keeps_changing():
    a = agg()
    t = 0.0
    while t < 5.0:
        a.observe(K, t, reason=Reason.INOTIFY, writing=False)
        assert a.due(t) == []
        t += 0.1
    a.observe(K, t, reason=Reason.INOTIFY, writing=False)
    assert a.due(t) == [K]


def test_settle_table_holds_one_entry_per_path_not_per_event():
    # A burst of 100k files is 300k events: memory must follow the paths held, not the events.
    a = agg()
    keys = [("c", f"/r/f{i}") for i in range(100)]
    for step in range(30):
        for k in keys:
            a.observe(k, step * 0.01, reason=Reason.INOTIFY, writing=step % 3 == 0)
    assert sum(len(b) - 2 for b in a._at.values()) <= 2 * len(keys)  # one live entry a path, one stale at most
    assert a.due(0.48) == []  # the last event of each (a close at 0.29) restarted its quiet period
    assert sorted(a.due(0.50)) == sorted(keys)
    assert a.due(10.0) == []  # each released once, until probed


def test_open_writer_is_held_until_it_closes():
    a = agg()
    a.observe(K, 0.0, reason=Reason.INOTIFY, writing=True)
    assert a.due(3.0) == []
    a.observe(K, 3.0, reason=Reason.INOTIFY, writing=False)
    assert a.due(3.1) == []
    assert a.due(3.2) == [K]


def test_idle_writer_released_after_max_delay():
    a = agg()
    a.observe(K, 0.0, reason=Reason.INOTIFY, writing=True)
    assert a.due(4.9) == []
    assert a.due(5.0) == [K]


def test_observation_without_writer_info_needs_two_equal_probes():
    a = agg()
    a.observe(K, 0.0, reason=Reason.RESCAN, verify=True)
    assert a.due(0.2) == [K]
    assert a.probed(K, FP1, 0.2) is None  # first look
    assert a.due(0.4) == [K]
    assert a.probed(K, FP2, 0.4) is None  # still growing
    assert a.due(0.61) == [K]
    p = a.probed(K, FP2, 0.61)
    assert p is not None and p.reason is Reason.RESCAN


def test_growth_check_is_not_cut_short_by_max_delay():
    a = agg()
    a.observe(K, 0.0, reason=Reason.RESCAN, verify=True)
    size = 0
    t = 0.2
    while t < 8:
        assert a.due(t) == [K]
        size += 1
        assert a.probed(K, Fingerprint(1, size, 0, 0), t) is None
        t += 0.2


def test_forced_wins_and_coalesces():
    a = agg()
    a.observe(K, 0.0, reason=Reason.INOTIFY, writing=False)
    a.observe(K, 0.1, reason=Reason.SIGNAL, forced=True)
    assert a.coalesced == 1
    p = a.probed(K, FP1, 0.5)
    assert p is not None and p.forced and p.reason is Reason.SIGNAL


@pytest.mark.parametrize(("text", "seconds"), [("200ms", 0.2), ("15s", 15.0), ("1.5m", 90.0), ("2h", 7200.0), (3, 3.0)])
def test_durations(text, seconds):
    assert parse_duration(text, "x") == seconds


@pytest.mark.parametrize("bad", ["fast", "-1s", "10 parsecs", True, -2])
def test_bad_durations(bad):
    with pytest.raises(ConfigError):
        parse_duration(bad, "x")


def write_cfg(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "reloadd.toml"
    p.write_text(body)
    return p


def test_config_errors_name_file_key_and_type(tmp_path):
    p = write_cfg(tmp_path, '[reloadd]\nquiet = 5\nrescan_interval = true\n')
    with pytest.raises(ConfigError, match=r"reloadd\.toml \[reloadd\]: expected a duration.*True|rescan_interval"):
        load_config(p)
    p = write_cfg(tmp_path, '[reloadd]\nstate_dri = "/x"\n')
    with pytest.raises(ConfigError, match=r"reloadd\.toml \[reloadd\]: unknown key\(s\) 'state_dri'"):
        load_config(p)
    p = write_cfg(tmp_path, '[[consumer]]\nname = "x"\nplugin = "exec"\npaths = "not-a-list"\n')
    with pytest.raises(ConfigError, match=r"\('x'\): key 'paths' must be .*got str"):
        load_config(p)
    p = write_cfg(tmp_path, "[reloadd\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(p)
    p = write_cfg(tmp_path, '[reloadd]\nquiet = "2s"\nmax_delay = "1s"\n')
    with pytest.raises(ConfigError, match="max_delay"):
        load_config(p)


def test_config_relative_paths_and_defaults(tmp_path):
    p = write_cfg(tmp_path, '[reloadd]\nstate_dir = "state"\n[[consumer]]\nname = "x"\nplugin = "exec"\n'
                  'paths = ["watched"]\nquiet = "1s"\nmax_delay = "9s"\n[consumer.options]\ncommand = ["true"]\n')
    cfg = load_config(p)
    assert cfg.state_dir == tmp_path / "state"
    assert cfg.rescan_interval == 15.0 and cfg.quiet == 0.05 and cfg.max_delay == 5.0
    (c,) = cfg.consumers
    assert c.paths == (tmp_path / "watched",) and c.quiet == 1.0 and c.max_delay == 9.0
    assert c.options == {"command": ["true"]}


def test_filter_defaults():
    f = PathFilter(roots=(Path("/r"),))
    for name in ("app.conf", "config.yaml", ".hidden.conf"):
        assert f(Path("/r") / name), name
    # kubelet's bookkeeping is never handed over itself (its swap is: see test_configmap_data_swap)
    for name in (".app.conf.swp", ".app.conf.swx", "app.conf~", "4913", ".#app.conf", "#app.conf#", "x.tmp"):
        assert not f(Path("/r") / name), name
    assert not f(Path("/r/..2026_11_30/app.conf"))
    assert not f(Path("/elsewhere/app.conf"))


def test_filter_globs_and_recursion():
    f = PathFilter(roots=(Path("/r"),), include=("*.yaml",), exclude=("skip/*",), recursive=True)
    assert f(Path("/r/a.yaml")) and f(Path("/r/deep/b.yaml"))
    assert not f(Path("/r/a.json")) and not f(Path("/r/skip/c.yaml"))
    flat = PathFilter(roots=(Path("/r"),), recursive=False)
    assert flat(Path("/r/a")) and not flat(Path("/r/sub/a"))


def test_state_journal_replay_torn_line_and_compaction(tmp_path):
    s = RecordStore(tmp_path / "st", compact_after=5)
    s.load()
    s.put(Path("/a"), PathRecord(FP1, "d1", {"images": ["x"]}))
    s.put(Path("/b"), PathRecord(FP2))
    s.flush()
    s.drop(Path("/b"))
    s.flush()
    journal = next((tmp_path / "st").glob("records.journal.*"))
    with open(journal, "a") as fh:
        fh.write('{"p": "/c", "r": {"fp": [1, 2')  # a crash mid-append
    t = RecordStore(tmp_path / "st")
    t.load()
    assert dict(t) == {Path("/a"): PathRecord(FP1, "d1", {"images": ["x"]})}
    for i in range(10):
        t.put(Path(f"/n{i}"), PathRecord(FP1))
    t._compact_after = 5
    t.flush()  # over the threshold: a new snapshot and a new journal generation
    u = RecordStore(tmp_path / "st")
    u.load()
    assert len(u) == 11 and u[Path("/n9")] == PathRecord(FP1)
    assert json.loads((tmp_path / "st" / "records.json").read_text())["gen"] == 1
    assert oct(os.stat(tmp_path / "st").st_mode & 0o777) == "0o700"


def test_a_mass_removal_writes_one_snapshot_not_one_per_halving(tmp_path, monkeypatch):
    """Removing 1,000 of 1,000 recorded paths a batch of 10 at a time: the journal may grow as long as the
    snapshot before it is compacted, so the removal writes one small snapshot at its end (it wrote a snapshot
    of the remaining records each time the journal outgrew them: 500, 250, 125... of them) and the state
    read back is right at every point."""
    import reloadd._state._records

    s = RecordStore(tmp_path / "st", compact_after=10)
    s.load()
    for i in range(1000):
        s.put(Path(f"/f{i}"), PathRecord(FP1))
    s.compact()
    written: list[int] = []
    real = reloadd._state._records.RecordStore._compact

    def counted(self, records):  # type: ignore[no-untyped-def]
        written.append(len(records))
        real(self, records)

    monkeypatch.setattr(reloadd._state._records.RecordStore, "_compact", counted)
    for start in range(0, 1000, 10):
        for i in range(start, start + 10):
            s.drop(Path(f"/f{i}"))
        s.flush()
        if start == 500:
            half = RecordStore(tmp_path / "st")
            half.load()
            assert set(half) == {Path(f"/f{i}") for i in range(510, 1000)}
    assert sum(written) <= 10, written  # one compaction (of what was left then), not ~1,000 records rewritten
    again = RecordStore(tmp_path / "st")
    again.load()
    assert len(again) == 0


def test_atomic_write_on_a_full_disk_leaves_old_file(tmp_path):
    import subprocess

    disk = tmp_path / "tiny"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=True)
    try:
        target = disk / "records.json"
        atomic_write(target, b"old state")
        with pytest.raises(reloadd.StateError, match=r"records\.json.*No space left"):
            atomic_write(target, b"x" * (1 << 20))
        assert target.read_bytes() == b"old state"
        assert [p.name for p in disk.iterdir()] == ["records.json"]  # no temp file left behind
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_public_api_is_curated_and_sorted():
    def isort_style(name: str) -> tuple[int, str]:  # constants, then classes, then functions (ruff RUF022)
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert reloadd.__all__ == sorted(reloadd.__all__, key=isort_style)
    lazy = set(reloadd._LAZY)  # imported on first use
    assert set(reloadd.__all__) == {n for n in vars(reloadd) if not n.startswith("_") and n != "annotations"} | lazy
    for name in reloadd.__all__:
        assert getattr(reloadd, name) is not None
        assert getattr(reloadd, name).__doc__ or name in ("JSONValue", "Result", "ConsumerFactory", "DEFAULT_IGNORES")


async def test_state_dir_is_locked(tmp_path):
    from reloadd import Reloader, StateError, parse_config

    cfg = parse_config({"reloadd": {"state_dir": str(tmp_path / "state")}})
    async with Reloader(cfg):
        with pytest.raises(StateError, match="in use by another reloadd"):
            async with Reloader(cfg):
                pass
    async with Reloader(cfg):  # released on close
        pass


def test_only_local_file_systems_are_taken_on_trust():
    # A watch hears only what is done on this machine: network and FUSE file systems, and an
    # overlay's layers underneath, change without a word. (A fake mountinfo: no NFS mount here.)
    from reloadd._pipeline._scan import local_devices

    text = "\n".join([
        "22 27 0:21 / /proc rw,relatime - proc proc rw",
        "30 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw",
        "31 30 0:40 / /mnt/nfs rw,relatime shared:7 - nfs4 server:/export rw,vers=4.2",
        "32 30 0:41 / /mnt/sshfs rw - fuse.sshfs host:/ rw",
        "33 30 0:42 / /run rw,nosuid shared:5 - tmpfs tmpfs rw,mode=755",
        "34 30 0:43 / /var/lib/docker/overlay2/x/merged rw - overlay overlay rw,lowerdir=/a",
        "35 30 0:44 / /mnt/with\\040space rw master:3 propagate_from:2 - xfs /dev/sdb rw",
        "garbage",
    ])
    assert local_devices(text) == {os.makedev(8, 1), os.makedev(0, 42), os.makedev(0, 44)}
    assert os.stat("/dev/shm").st_dev in local_devices()  # the real table, read by default


def test_one_backoff_doubles_caps_and_jitters_within_initial() -> None:
    from reloadd import Backoff

    plain = Backoff(0.1, 1.0, jitter=False)
    assert [plain.delay(n) for n in range(1, 7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert plain.delay(0) == pytest.approx(0.1)  # "before the first retry" is the first delay
    jittered = Backoff(0.2, 30.0)
    for n, base in ((1, 0.2), (3, 0.8)):
        samples = [jittered.delay(n) for _ in range(200)]
        assert all(base <= d <= base + 0.2 for d in samples) and len(set(samples)) > 1
    assert max(Backoff(0.2, 1.0).delay(10) for _ in range(50)) <= 1.0  # the cap holds with jitter


def test_a_digest_is_reused_only_for_the_fingerprint_it_was_read_at(tmp_path):
    import hashlib

    from reloadd._pipeline._digests import DigestCache

    cache = DigestCache(max_entries=4)
    f = tmp_path / "a"
    f.write_bytes(b"one")
    fp1 = Fingerprint.from_stat(os.stat(f))
    assert cache.digest(f, fp1) == hashlib.sha256(b"one").hexdigest()
    f.write_bytes(b"two!")
    fp2 = Fingerprint.from_stat(os.stat(f))
    assert cache.digest(f, fp2) == hashlib.sha256(b"two!").hexdigest()  # not the one cached for fp1
    for i in range(10):  # more files than the cache holds: each still digested right
        g = tmp_path / f"g{i}"
        g.write_bytes(str(i).encode())
        assert cache.digest(g, Fingerprint.from_stat(os.stat(g))) == hashlib.sha256(str(i).encode()).hexdigest()
    assert len(cache._cache) <= 4


def test_the_fast_constructors_build_what_the_dataclasses_do() -> None:
    from reloadd import Change, ChangeKind, SourceEvent
    from reloadd._source import EventKind, file_event
    from reloadd._types import new_change

    fp = Fingerprint(1, 2, 3, 4)
    fields = (Path("/w/a"), ChangeKind.MODIFIED, fp, "d" * 64, True, Path("/w"), True)
    built = new_change(*fields)
    assert built == Change(*fields) and hash(built) == hash(Change(*fields))
    assert (built.path, built.kind, built.fingerprint, built.digest, built.forced, built.root,
            built.prune_confirmed) == fields
    event = file_event(EventKind.WRITTEN, "/w/a", "inotify", 2)
    assert event == SourceEvent(EventKind.WRITTEN, "/w/a", "inotify", 2)
    assert (event.kind, event.path, event.source, event.folded, event.consumer, event.drift, event.lost_at) == (
        EventKind.WRITTEN, "/w/a", "inotify", 2, None, None, None)
    with pytest.raises(AttributeError):
        built.path = Path("/elsewhere")  # type: ignore[misc]  # still frozen
