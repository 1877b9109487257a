"""The health book: file states from object verdicts, stale observations ignored, fail-fast, HealthTimeout.

No cluster: objects as the API server returns them, fed as the apply answer and the watch would.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from reloadd_kube_manifests._applyset import ObjRef
from reloadd_kube_manifests._health import BUCKETS, FileHealthState, FileState, HealthBook

pytestmark = pytest.mark.timeout(30)

WEB = ObjRef("apps", "Deployment", "web", "app")
CM = ObjRef("", "ConfigMap", "web", "conf")
PATH = Path("/m/web.yaml")


def deployment(rv: int, *, generation: int = 1, observed: int | None = 1, ready: bool = False,
               deadline: bool = False) -> dict[str, Any]:
    st: dict[str, Any] = {"replicas": 1, "updatedReplicas": 1, "readyReplicas": int(ready),
                          "availableReplicas": int(ready)}
    if observed is not None:
        st["observedGeneration"] = observed
    conds = []
    if ready:
        conds = [{"type": "Available", "status": "True"},
                 {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]
    if deadline:
        conds = [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                  "message": 'ReplicaSet "app-5d" has timed out progressing.'}]
    st["conditions"] = conds
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "app", "namespace": "web", "generation": generation, "resourceVersion": str(rv)},
            "spec": {"replicas": 1, "progressDeadlineSeconds": 10}, "status": st}


def configmap(rv: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "conf", "namespace": "web",
                                                                  "resourceVersion": str(rv)}}


class Moves:
    def __init__(self) -> None:
        self.seen: list[tuple[FileState | None, FileState, tuple[str, str, str]]] = []

    def __call__(self, path: Path, old: FileState | None, f: FileHealthState) -> None:
        self.seen.append((old, f.state, f.failure))

    @property
    def states(self) -> list[FileState]:
        return [s for _, s, _ in self.seen]


def book(timeout: float = 60.0) -> tuple[HealthBook, Moves]:
    moves = Moves()
    return HealthBook(timeout, on_change=moves), moves


async def test_applying_progressing_current_and_the_histogram() -> None:
    b, moves = book()
    b.applying(PATH, saved=b.clock() - 2.0)
    b.applied(PATH, {WEB: deployment(10), CM: configmap(11)}, (CM, WEB))
    assert b.files[PATH].state is FileState.PROGRESSING
    assert b.files[PATH].failure[0] == "Deployment web/app"
    assert b.report().settling and b.report().objects["progressing"] == 1 and b.report().objects["current"] == 1
    b.observe(WEB, deployment(12, ready=True))
    assert moves.states == [FileState.APPLYING, FileState.PROGRESSING, FileState.CURRENT]
    report = b.report()
    assert not report.settling and report.files == () and report.objects["current"] == 2
    assert report.to_current.count == 1 and 2.0 <= report.to_current.total < 10.0
    assert report.to_current.bounds == BUCKETS and report.to_current.counts[-1] == 1


async def test_an_observation_older_than_the_apply_answer_is_stale() -> None:
    """argoproj/argo-cd#4669: a watch event queued before the apply says nothing about what was applied."""
    b, _ = book()
    b.applying(PATH, saved=b.clock())
    b.applied(PATH, {WEB: deployment(20, generation=2, observed=1)}, (WEB,))
    b.observe(WEB, deployment(15, generation=1, observed=1, ready=True))  # before the apply: ignored
    assert b.files[PATH].state is FileState.PROGRESSING
    assert b.files[PATH].failure[1] == "LatestGenerationNotObserved"
    b.observe(WEB, deployment(21, generation=2, observed=2, ready=True))
    assert b.files[PATH].state is FileState.CURRENT


async def test_a_watch_event_ahead_of_the_answer_is_kept() -> None:
    """A controller quicker than the consumer's bookkeeping: the newer observation wins over the answer."""
    b, _ = book()
    b.observe(WEB, deployment(30, ready=True))
    b.applying(PATH, saved=b.clock())
    b.applied(PATH, {WEB: deployment(29)}, (WEB,))
    assert b.files[PATH].state is FileState.CURRENT


async def test_fail_fast_names_object_reason_and_message_then_recovers() -> None:
    b, moves = book()
    b.applying(PATH, saved=b.clock())
    b.applied(PATH, {WEB: deployment(10), CM: configmap(11)}, (CM, WEB))
    b.observe(WEB, deployment(12, deadline=True))
    assert b.files[PATH].state is FileState.FAILED
    assert b.files[PATH].failure == ("Deployment web/app", "ProgressDeadlineExceeded",
                                     'ReplicaSet "app-5d" has timed out progressing.')
    (line,) = [f.line() for f in b.report().files]
    assert line == ('FAILED /m/web.yaml: Deployment web/app: ProgressDeadlineExceeded: ReplicaSet "app-5d" has '
                    'timed out progressing.')
    assert not b.report().settling  # failed is settled: `after` goes on
    b.observe(WEB, deployment(13, generation=2, observed=1))  # a new rollout, not observed: still failed
    assert b.files[PATH].state is FileState.FAILED
    b.observe(WEB, deployment(14, generation=2, observed=2, ready=True))
    assert moves.seen[-1][:2] == (FileState.FAILED, FileState.CURRENT)


async def test_health_timeout_fails_a_file_still_progressing() -> None:
    b, moves = book(timeout=0.05)
    changed = asyncio.Event()
    def on_change(p: Path, o: FileState | None, f: FileHealthState) -> None:
        moves(p, o, f)
        if f.state is FileState.FAILED:
            changed.set()

    b.on_change = on_change
    b.applying(PATH, saved=b.clock())
    b.applied(PATH, {WEB: deployment(10)}, (WEB,))
    await asyncio.wait_for(changed.wait(), 5)
    obj, reason, message = b.files[PATH].failure
    assert (obj, reason) == ("Deployment web/app", "HealthTimeout")
    assert message.startswith("not current after 0.05s (LessAvailable:"), message


async def test_a_current_file_does_not_time_out_and_a_reapply_restarts_the_clock() -> None:
    b, _ = book(timeout=0.05)
    b.applying(PATH, saved=b.clock())
    b.applied(PATH, {CM: configmap(1)}, (CM,))
    await asyncio.sleep(0.1)  # the timer would have fired by now: nothing to await but its absence
    assert b.files[PATH].state is FileState.CURRENT
    b.applying(PATH, saved=b.clock())
    assert b.report().settling


async def test_deleted_object_is_progressing_and_removed_file_is_forgotten() -> None:
    b, _ = book()
    b.applying(PATH, saved=b.clock())
    b.applied(PATH, {CM: configmap(1)}, (CM,))
    b.observe(CM, None)
    assert b.files[PATH].state is FileState.PROGRESSING and b.files[PATH].failure[1] == "NotFound"
    b.removed(PATH)
    assert b.report().files == () and sum(b.report().objects.values()) == 0


async def test_restore_judges_from_the_first_list() -> None:
    """reloadd restarted mid-rollout: progressing until the watch lists the objects, then their real health."""
    b, _ = book()
    b.restore(PATH, (WEB,))
    assert b.files[PATH].state is FileState.PROGRESSING and b.report().settling
    b.observe(WEB, deployment(40, ready=True))
    assert b.files[PATH].state is FileState.CURRENT
    assert b.report().to_current.count == 0  # no save to count from


async def test_apply_failed_and_untracked() -> None:
    b, _ = book()
    b.applying(PATH, saved=b.clock())
    b.apply_failed(PATH, "ApplyFailed", "doc 1: 422")
    assert b.files[PATH].state is FileState.FAILED and b.files[PATH].failure == ("", "ApplyFailed", "doc 1: 422")
    other = Path("/m/other.yaml")
    b.applying(other, saved=b.clock())
    b.untracked(other)
    assert b.files[other].state is FileState.CURRENT
