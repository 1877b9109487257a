"""containerd-events: an image another file of the consumer is pulling or relabelling right now is not drift.

The race a real containerd shows only sometimes (tests/containerd_images/test_plan.py caught it under load): a
``.txt`` lists an image a tarball already imported; its relabel event arrives before the ``.txt``'s answer is
recorded, so the tarball looked like the image's only owner and the image "relabelled" away from it. The
events source is driven here with a stand-in for containerd's answer, which the real daemon cannot be made to
give at that instant.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from reloadd_containerd_images._events import ImageEvents
from reloadd_containerd_images._state import PIN_LABEL, SOURCE_LABEL, FileImages

from reloadd import Fingerprint, PathRecord, SourceContext, SourceEvent


class _Client:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels

    async def get_image(self, name: str, namespace: str | None = None) -> Any:
        return SimpleNamespace(name=name, labels=self.labels)


def _events(tmp_path: Path, busy: set[Path]) -> tuple[ImageEvents, list[SourceEvent], Path, Path]:
    tar, txt = tmp_path / "a.tar", tmp_path / "prepull.txt"
    tar.write_text("archive")
    txt.write_text("example.com/a:v1\n")
    image = ("example.com/a:v1", "sha256:" + "a" * 64, ("example.com/a:v1",))
    record = PathRecord(Fingerprint(1, 1, 1, 1), None, FileImages("tar", (image,)).to_json())
    emitted: list[SourceEvent] = []
    ctx = SourceContext(roots=(), emit=emitted.append)

    async def check() -> list[Path]:
        return []

    source = ImageEvents(ctx, consumer="images", address="unused", namespaces=["k8s.io"],
                         records=lambda: [(tar, record)], pin=True, check=check, busy=busy.__contains__)
    return source, emitted, tar, txt


async def test_a_relabel_by_a_file_still_being_handled_waits_for_its_answer(tmp_path: Path) -> None:
    busy: set[Path] = set()
    source, emitted, _, txt = _events(tmp_path, busy)
    busy.add(txt)
    labels = {SOURCE_LABEL: str(txt), PIN_LABEL: "pinned"}
    await source._judge(_Client(labels), "/images/update", "example.com/a:v1", "k8s.io", labels)
    assert emitted == []  # judged once prepull.txt's answer is in, not taken from a.tar now
    assert list(source._stash.values()) == [("/images/update", txt)]


async def test_a_relabel_by_a_file_at_rest_is_drift_of_the_owner(tmp_path: Path) -> None:
    source, emitted, tar, txt = _events(tmp_path, set())
    labels = {SOURCE_LABEL: str(txt), PIN_LABEL: "pinned"}
    await source._judge(_Client(labels), "/images/update", "example.com/a:v1", "k8s.io", labels)
    assert [(e.path, e.drift.why if e.drift else None) for e in emitted] == [(tar, "relabelled")]
