"""``_provided``: the image names a file declares, read without containerd (a failed import records none), and
the state each name is in as the consumer's ``provisions("image")`` answers it."""

from __future__ import annotations

from pathlib import Path

from reloadd_containerd_images._provided import Provided, archive_names, names_of

from reloadd import Ack, PathRecord, ProvisionState, Reject, Retry
from tests.infra import busybox_image, write_oci_archive


def test_names_of_an_archive_whose_blobs_are_missing_and_of_a_list(tmp_path: Path) -> None:
    built = busybox_image("registry.local/web:1.4")
    tar = tmp_path / "web.tar"
    write_oci_archive(tar, [built], omit=[built.platforms[0].config.digest])
    assert archive_names(tar) == ("registry.local/web:1.4",)
    (tmp_path / "half.tar").write_bytes(tar.read_bytes()[:1024])  # truncated: what was read still counts
    assert archive_names(tmp_path / "half.tar") in ((), ("registry.local/web:1.4",))
    (tmp_path / "junk.tar").write_bytes(b"not a tar")
    assert archive_names(tmp_path / "junk.tar") == ()
    (tmp_path / "list.txt").write_text("busybox:1.36  # base\nregistry.local/api@sha256:" + "a" * 64 + "\n")
    assert names_of(tmp_path / "list.txt") == ("docker.io/library/busybox:1.36",
                                              "registry.local/api@sha256:" + "a" * 64)


def test_states_from_records_and_outcomes(tmp_path: Path) -> None:
    ok, bad, refused, waiting = (tmp_path / f"{n}.tar" for n in ("ok", "bad", "refused", "waiting"))
    records = {ok: PathRecord(None, data={"kind": "tar", "images": [{"name": "docker.io/library/ok:1"}]})}
    busy: dict[Path, int] = {}
    p = Provided(records, lambda path: f"images/{path.name}", busy)
    p.outcome(bad, Reject("blob sha256:c is missing from the archive"), ("docker.io/library/bad:1",))
    p.outcome(refused, Reject("REFUSED images/refused.tar (sha256:…): no signature"), ("docker.io/library/r:1",))
    p.outcome(waiting, Retry("waiting for its signature", failure=False), ("docker.io/library/w:1",))
    got = {e.name: (e.state, e.detail, e.shown) for e in p.entries()}
    assert got == {
        "docker.io/library/ok:1": (ProvisionState.DELIVERED, "imported", "images/ok.tar"),
        "docker.io/library/bad:1": (ProvisionState.FAILED, "import failed: blob sha256:c is missing from the archive",
                                    "images/bad.tar"),
        "docker.io/library/r:1": (ProvisionState.REFUSED, "refused: REFUSED images/refused.tar (sha256:…): no "
                                  "signature", "images/refused.tar"),
        "docker.io/library/w:1": (ProvisionState.PENDING, "import pending: waiting for its signature",
                                  "images/waiting.tar"),
    }
    busy[bad] = 1
    p.outcome(ok, Ack(None), ())
    p.forget(refused)
    got = {e.name: e.state for e in p.entries()}
    assert got == {"docker.io/library/ok:1": ProvisionState.DELIVERED,
                   "docker.io/library/bad:1": ProvisionState.PENDING,
                   "docker.io/library/w:1": ProvisionState.PENDING}
