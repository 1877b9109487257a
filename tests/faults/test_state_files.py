"""Every state file of every built-in consumer, damaged four ways before a start: one consumer degrades, visibly.

One real :class:`reloadd.Reloader` runs the four built-in consumers (containerd-images on a private
containerd, registry-mirrors with a notify command, kube-manifests on a real kube-apiserver, exec). A
first run hands four files of each over, writes a records snapshot (``records.json``) and leaves one
acknowledgement in the journal (``records.journal.1``); ``prune.json`` and registry-mirrors'
``notified.sha256`` are written as in any run. That state is kept, and for each consumer, each of its
files and each damage (truncated, garbage, zero-length, removed) it is restored, damaged, and the
Reloader started again. What must hold, every time:

* the daemon starts (a damaged file of one consumer never stops the node);
* a file that cannot be read is moved aside (``<name>.broken-<UTC time>``, never deleted) with one
  WARNING naming it, where it went and what was assumed;
* the consumer starts from the safest assumption: records unreadable → every file handed over again
  once; a journal cut or lost → the one acknowledgement it held handed over again; ``prune.json``
  unreadable → every removal held until confirmed; ``notified.sha256`` → the notify command runs again;
* the other three consumers hand nothing over again; nothing is lost (every file acknowledged).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from reloadd import Reloader, parse_config
from tests.infra import ImageSpec, private_containerd, write_oci_archive
from tests.kube.apiserver import KubeCluster
from tests.registry_mirrors.conftest import mirror_conf
from tests.reliability import Reliability
from tests.waiting import until

pytestmark = pytest.mark.timeout(900)

CONSUMERS = ("images", "mirrors", "manifests", "hook")
FILES = 4  # per consumer: three in the snapshot, one in the journal after it


def _truncate(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: max(1, len(data) // 2)])


def _garbage(p: Path) -> None:
    p.write_bytes(b"\x00\xffnot reloadd's {state\n" * 4)


DAMAGES: dict[str, Callable[[Path], None]] = {
    "truncated": _truncate,
    "garbage": _garbage,
    "zero-length": lambda p: p.write_bytes(b""),
    "removed": lambda p: p.unlink(),
}


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def warnings_of_reloadd() -> Iterator[Warnings]:
    handler = Warnings()
    logger = logging.getLogger("reloadd")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def expected(file: str, damage: str) -> tuple[int, bool]:
    """(files of the damaged consumer handed over again, whether a file is set aside)."""
    if file == "records.json":
        return FILES, True  # removed: the journal after it names a snapshot that is gone, set aside too
    if file == "records.journal.1":
        return 1, damage == "garbage"  # cut or emptied: its torn line is cut, as after a crash
    return 0, damage != "removed"  # prune.json, notified.sha256


def cells() -> list[tuple[str, str, str]]:
    out = []
    for consumer in CONSUMERS:
        files = ["records.json", "records.journal.1", "prune.json"]
        if consumer == "mirrors":
            files.append("plugin/notified.sha256")
        out += [(consumer, f, d) for f in files for d in DAMAGES]
    return out


async def test_every_state_file_damaged_every_way(tmp_path: Path, kube: KubeCluster,
                                                  reliability: Reliability) -> None:
    images, manifests, hosts = tmp_path / "images", tmp_path / "manifests", tmp_path / "certs.d"
    etc, hooked = tmp_path / "etc", tmp_path / "hooked"
    conf_d = etc / "registries.conf.d"
    for d in (images, manifests, conf_d, hooked):
        d.mkdir(parents=True)
    notified = tmp_path / "notified.log"
    state, golden = tmp_path / "state", tmp_path / "golden"
    ns = f"state-{uuid.uuid4().hex[:8]}"
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, f"/api/v1/namespaces/{ns}")

    def add(i: int) -> None:
        write_oci_archive(images / f"t{i}.tar", [ImageSpec(f"example.com/state/i{i}:v1", seed=f"s{i}", layers=1,
                                                           layer_size=512)])
        (conf_d / f"{i:02d}.conf").write_text(mirror_conf(f"h{i}.state.example.com", f"m{i}.example.net"))
        (manifests / f"c{i}.yaml").write_text(json.dumps(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"c{i}", "namespace": ns},
             "data": {"i": str(i)}}) + "\n")
        (hooked / f"f{i}.conf").write_text(str(i))

    async with private_containerd(tmp_path) as ctd:
        cfg = parse_config({
            "reloadd": {"state_dir": str(state), "quiet": "100ms", "max_delay": "2s"},
            "consumer": [
                {"name": "images", "plugin": "containerd-images", "paths": [str(images)],
                 "options": {"address": ctd.address}},
                {"name": "mirrors", "plugin": "registry-mirrors",
                 "options": {"registries_conf": str(etc / "registries.conf"), "registries_conf_d": str(conf_d),
                             "hosts_dir": str(hosts), "certs_dirs": [], "containerd_config": "",
                             "notify": {"command": ["sh", "-c", f"echo >> {notified}"]}}},
                {"name": "manifests", "plugin": "kube-manifests", "paths": [str(manifests)],
                 "options": {"kubeconfig": str(kube.kubeconfig)}},
                {"name": "hook", "plugin": "exec", "paths": [str(hooked)], "options": {"command": ["true"]}},
            ],
        })

        def acked(r: Reloader) -> dict[str, int]:
            return {c.name: c.acked for c in r.snapshot().consumers}

        # The state every cell starts from: FILES - 1 records in a snapshot, one more in the journal after it.
        for i in range(FILES - 1):
            add(i)
        async with Reloader(cfg) as r:
            await r.wait_idle(120)
            assert acked(r) == dict.fromkeys(CONSUMERS, FILES - 1)
            for name in CONSUMERS:
                r.engine.slots[name].records.compact()
            add(FILES - 1)
            await until(lambda: acked(r) == dict.fromkeys(CONSUMERS, FILES), what="the journal's file handed over")
            await r.wait_idle(60)
        for name in CONSUMERS:
            d = state / "consumers" / name
            assert {p.name for p in d.iterdir()} >= {"records.json", "records.journal.1", "prune.json"}, name
        shutil.copytree(state, golden)

        rows: dict[tuple[str, str], list[str]] = {}
        started = time.monotonic()
        for consumer, file, damage in cells():
            shutil.rmtree(state)
            shutil.copytree(golden, state)
            target = state / "consumers" / consumer / file
            DAMAGES[damage](target)
            again, aside = expected(file, damage)
            notifies = notified.read_text().count("\n")
            with warnings_of_reloadd() as logs:
                async with Reloader(cfg) as r:  # the daemon starts: one consumer's state never stops it
                    await r.wait_idle(120)
                    got = acked(r)
                    snap = r.snapshot()
                    set_aside_n = {c.name: c.state_set_aside for c in snap.consumers}
            cell = f"{consumer} {file} {damage}"
            assert got == {n: again if n == consumer else 0 for n in CONSUMERS}, cell
            moved = sorted(p.name for p in target.parent.glob("*.broken-*"))
            said = [line for line in logs.lines if "cannot be read" in line]
            if aside:
                assert moved and said, (cell, moved, logs.lines)
                assert str(target.parent) in said[0] and ".broken-" in said[0], said
                if not file.startswith("plugin/"):
                    assert set_aside_n[consumer] >= 1, cell
            else:
                assert not moved and not said, (cell, moved, said)
            assert all(n == 0 for c, n in set_aside_n.items() if c != consumer), cell
            if file.endswith("notified.sha256"):
                assert notified.read_text().count("\n") == notifies + 1, cell  # notified again, once
            rows.setdefault((file.removeprefix("plugin/"), damage), []).append(f"{consumer} {again}")
        seconds = time.monotonic() - started

        # prune.json unreadable: every removal is held until a person confirms, then it runs.
        shutil.rmtree(state)
        shutil.copytree(golden, state)
        for name in CONSUMERS:
            _garbage(state / "consumers" / name / "prune.json")
        victims = {"images": images / f"t{FILES - 1}.tar", "mirrors": conf_d / f"{FILES - 1:02d}.conf",
                   "manifests": manifests / f"c{FILES - 1}.yaml", "hook": hooked / f"f{FILES - 1}.conf"}
        async with Reloader(cfg) as r:
            await r.wait_idle(120)
            assert acked(r) == dict.fromkeys(CONSUMERS, 0)
            for victim in victims.values():
                victim.unlink()
            deadline = time.monotonic() + 60
            while not all(r.status()["consumers"][n]["prune_held"] for n in CONSUMERS):
                assert time.monotonic() < deadline, r.status()["consumers"]
                await r.wait_idle(60)
            status = r.status()["consumers"]
            assert acked(r) == dict.fromkeys(CONSUMERS, 0)  # no removal handed over
            for name in CONSUMERS:
                assert "unreadable" in json.dumps(status[name]["prune_held"]), status[name]["prune_held"]
            assert await r.confirm_prune() >= len(CONSUMERS)
            await r.wait_idle(60)
            assert acked(r) == dict.fromkeys(CONSUMERS, 1)  # confirmed: each removal handed over once
            assert not any(r.status()["consumers"][n]["prune_held"] for n in CONSUMERS)
        shutil.rmtree(state)

    for (file, damage), outcomes in rows.items():
        _, aside = expected(file if file != "notified.sha256" else "plugin/" + file, damage)
        total_again = sum(int(o.split()[1]) for o in outcomes)
        if file == "prune.json" and damage != "removed":
            outcomes = [f"{o} (every removal held until confirmed)" for o in outcomes]
        if file == "notified.sha256":
            outcomes = [f"{o} (its notify command ran again, once)" for o in outcomes]
        reliability.record(
            f"state file {file} {damage} before a start",
            trials=len(outcomes), expected=FILES * len(outcomes), delivered=FILES * len(outcomes),
            duplicates=total_again,
            notes=(f"handed over again per consumer: {', '.join(outcomes)}; "
                   f"{'moved aside + one WARNING' if aside else 'nothing to set aside'}; "
                   "the daemon started, the other consumers handed over nothing again"),
        )
    print(f"{len(cells())} cells in {seconds:.0f}s")

