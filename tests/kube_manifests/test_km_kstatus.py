"""kstatus' rules, one row per rule of the note (../shared/notes/kubernetes-health-and-readiness.md §1), in order.

Pure: no cluster. Each row is an object as the API server would return it and the verdict kstatus gives.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from reloadd_kube_manifests._kstatus import Health, compute

C, P, F, T = Health.CURRENT, Health.PROGRESSING, Health.FAILED, Health.TERMINATING
NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def obj(api: str, kind: str, *, spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None,
        conditions: list[tuple[str, str, str]] | None = None, **meta: Any) -> dict[str, Any]:
    st = dict(status or {})
    if conditions is not None:
        st["conditions"] = [{"type": t, "status": s, "reason": r, "message": f"{t} {r}"} for t, s, r in conditions]
    return {"apiVersion": api, "kind": kind, "metadata": {"name": "x", **meta}, "spec": spec or {}, "status": st}


def deploy(want: int = 1, *, counts: int | None = None, conditions: list[tuple[str, str, str]] | None = None,
           deadline: int | None = 600, **status: Any) -> dict[str, Any]:
    n = want if counts is None else counts
    st = {"replicas": n, "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n, **status}
    spec: dict[str, Any] = {"replicas": want}
    if deadline is not None:
        spec["progressDeadlineSeconds"] = deadline
    return obj("apps/v1", "Deployment", spec=spec, status=st, conditions=conditions, generation=1)


GOOD = [("Available", "True", "MinimumReplicasAvailable"), ("Progressing", "True", "NewReplicaSetAvailable")]
CREATED_LONG_AGO = (NOW - timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ")
CREATED_NOW = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")

ROWS: list[tuple[str, dict[str, Any], Health, str]] = [
    # 1. Terminating first, whatever else
    ("terminating", obj("v1", "ConfigMap", deletionTimestamp="2026-01-01T00:00:00Z"), T, "Terminating"),
    # 2. generation not observed (both present and different); absent observedGeneration decides nothing
    ("not observed", {**deploy(conditions=GOOD), "metadata": {"name": "x", "generation": 2},
                      "status": {**deploy(conditions=GOOD)["status"], "observedGeneration": 1}},
     P, "LatestGenerationNotObserved"),
    ("observed", {**deploy(conditions=GOOD), "status": {**deploy(conditions=GOOD)["status"],
                                                        "observedGeneration": 1}}, C, ""),
    ("no observedGeneration: next rules", obj("example.com/v1", "Widget", generation=3), C, ""),
    # 3. Reconciling / Stalled (abnormal-true)
    ("reconciling", obj("example.com/v1", "Widget", conditions=[("Reconciling", "True", "Working")]), P, "Working"),
    ("stalled", obj("example.com/v1", "Widget", conditions=[("Stalled", "True", "Broken")]), F, "Broken"),
    ("stalled false", obj("example.com/v1", "Widget", conditions=[("Stalled", "False", "Fine")]), C, ""),
    # 4. Deployment
    ("deadline exceeded wins", deploy(counts=0, conditions=[("Progressing", "False", "ProgressDeadlineExceeded")]),
     F, "ProgressDeadlineExceeded"),
    ("fewer replicas", deploy(2, counts=1, conditions=GOOD), P, "LessReplicas"),
    ("fewer updated", deploy(2, conditions=GOOD, updatedReplicas=1), P, "LessUpdated"),
    ("extra pods", deploy(1, conditions=GOOD, replicas=2, updatedReplicas=1, readyReplicas=1,
                          availableReplicas=1), P, "ExtraPods"),
    ("updated > available", deploy(2, conditions=GOOD, availableReplicas=1), P, "LessAvailable"),
    ("fewer ready", deploy(2, conditions=GOOD, readyReplicas=1, availableReplicas=0, updatedReplicas=0), P,
     "LessUpdated"),
    ("ready short", deploy(2, conditions=GOOD, readyReplicas=1), P, "LessReady"),
    ("no NewReplicaSetAvailable", deploy(conditions=[("Available", "True", "MinimumReplicasAvailable"),
                                                     ("Progressing", "True", "ReplicaSetUpdated")]),
     P, "NewReplicaSetNotAvailable"),
    ("no deadline: no Progressing needed", deploy(deadline=None, conditions=[("Available", "True", "M")]), C, ""),
    ("deadline MaxInt32: no Progressing needed", deploy(deadline=2**31 - 1, conditions=[("Available", "True", "M")]),
     C, ""),
    ("not Available", deploy(conditions=[("Progressing", "True", "NewReplicaSetAvailable")]), P, "NotAvailable"),
    ("deployment current", deploy(conditions=GOOD), C, ""),
    ("replicas 0 current", deploy(0, conditions=GOOD), C, ""),
    ("fresh deployment (empty status)", obj("apps/v1", "Deployment", spec={"replicas": 1}), P, "LessReplicas"),
    ("replicas defaults to 1", obj("apps/v1", "Deployment", status={"replicas": 0}), P, "LessReplicas"),
    # StatefulSet
    ("sts OnDelete", obj("apps/v1", "StatefulSet", spec={"replicas": 3, "updateStrategy": {"type": "OnDelete"}}),
     C, ""),
    ("sts fewer replicas", obj("apps/v1", "StatefulSet", spec={"replicas": 2}, status={"replicas": 1}), P,
     "LessReplicas"),
    ("sts fewer ready", obj("apps/v1", "StatefulSet", spec={"replicas": 2}, status={"replicas": 2,
                                                                                    "readyReplicas": 1}),
     P, "LessReady"),
    ("sts extra", obj("apps/v1", "StatefulSet", spec={"replicas": 1}, status={"replicas": 2, "readyReplicas": 2}),
     P, "ExtraPods"),
    ("sts partition short", obj("apps/v1", "StatefulSet", spec={"replicas": 3, "updateStrategy": {
        "type": "RollingUpdate", "rollingUpdate": {"partition": 1}}}, status={
        "replicas": 3, "readyReplicas": 3, "updatedReplicas": 1}), P, "PartitionRollout"),
    ("sts partition done", obj("apps/v1", "StatefulSet", spec={"replicas": 3, "updateStrategy": {
        "type": "RollingUpdate", "rollingUpdate": {"partition": 0}}}, status={
        "replicas": 3, "readyReplicas": 3, "updatedReplicas": 3, "currentRevision": "a", "updateRevision": "b"}),
     C, ""),
    ("sts fewer current", obj("apps/v1", "StatefulSet", spec={"replicas": 2}, status={
        "replicas": 2, "readyReplicas": 2, "currentReplicas": 1}), P, "LessCurrent"),
    ("sts revisions differ", obj("apps/v1", "StatefulSet", spec={"replicas": 2}, status={
        "replicas": 2, "readyReplicas": 2, "currentReplicas": 2, "currentRevision": "a", "updateRevision": "b"}),
     P, "RevisionMismatch"),
    ("sts current", obj("apps/v1", "StatefulSet", spec={"replicas": 2}, status={
        "replicas": 2, "readyReplicas": 2, "currentReplicas": 2, "currentRevision": "a", "updateRevision": "a"}),
     C, ""),
    # DaemonSet
    ("ds no generation", obj("apps/v1", "DaemonSet", status={"observedGeneration": 1}), P,
     "LatestGenerationNotObserved"),
    ("ds no desired", obj("apps/v1", "DaemonSet", generation=1, status={"observedGeneration": 1}), P,
     "NoDesiredNumber"),
    ("ds short", obj("apps/v1", "DaemonSet", generation=1, status={
        "observedGeneration": 1, "desiredNumberScheduled": 2, "currentNumberScheduled": 2,
        "updatedNumberScheduled": 2, "numberAvailable": 1, "numberReady": 2}), P, "LessAvailable"),
    ("ds current", obj("apps/v1", "DaemonSet", generation=1, status={
        "observedGeneration": 1, "desiredNumberScheduled": 2, "currentNumberScheduled": 2,
        "updatedNumberScheduled": 2, "numberAvailable": 2, "numberReady": 2}), C, ""),
    # ReplicaSet
    ("rs ReplicaFailure is progressing", obj("apps/v1", "ReplicaSet", conditions=[
        ("ReplicaFailure", "True", "FailedCreate")]), P, "FailedCreate"),
    ("rs short", obj("apps/v1", "ReplicaSet", spec={"replicas": 2}, status={
        "fullyLabeledReplicas": 2, "availableReplicas": 1, "readyReplicas": 2}), P, "LessAvailable"),
    ("rs current", obj("apps/v1", "ReplicaSet", spec={"replicas": 1}, status={
        "fullyLabeledReplicas": 1, "availableReplicas": 1, "readyReplicas": 1}), C, ""),
    # Pod
    ("pod succeeded", obj("v1", "Pod", status={"phase": "Succeeded"}), C, "PodSucceeded"),
    ("pod failed is current", obj("v1", "Pod", status={"phase": "Failed"}), C, "PodFailed"),
    ("pod running ready", obj("v1", "Pod", status={"phase": "Running"}, conditions=[("Ready", "True", "")]), C, ""),
    ("pod crash loop", obj("v1", "Pod", status={"phase": "Running", "containerStatuses": [
        {"name": "app", "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}}]}),
     F, "CrashLoopBackOff"),
    ("pod running not ready", obj("v1", "Pod", status={"phase": "Running"}), P, "PodRunningNotReady"),
    ("pod unschedulable early", obj("v1", "Pod", creationTimestamp=CREATED_NOW, status={"phase": "Pending"},
                                    conditions=[("PodScheduled", "False", "Unschedulable")]), P, "Unschedulable"),
    ("pod unschedulable late", obj("v1", "Pod", creationTimestamp=CREATED_LONG_AGO, status={"phase": "Pending"},
                                   conditions=[("PodScheduled", "False", "Unschedulable")]), F, "Unschedulable"),
    ("pod pending", obj("v1", "Pod", status={"phase": "Pending"}), P, "PodPending"),
    ("pod no phase", obj("v1", "Pod"), P, "PodNoPhase"),
    # PVC, Service
    ("pvc pending", obj("v1", "PersistentVolumeClaim", status={"phase": "Pending"}), P, "NotBound"),
    ("pvc bound", obj("v1", "PersistentVolumeClaim", status={"phase": "Bound"}), C, ""),
    ("lb without clusterIP", obj("v1", "Service", spec={"type": "LoadBalancer"}), P, "NoClusterIP"),
    ("lb with clusterIP, no ingress", obj("v1", "Service", spec={"type": "LoadBalancer", "clusterIP": "10.0.0.1"}),
     C, ""),
    ("clusterip service", obj("v1", "Service", spec={"clusterIP": "10.0.0.2"}), C, ""),
    # Job
    ("job complete", obj("batch/v1", "Job", conditions=[("Complete", "True", "")]), C, "Complete"),
    ("job failed", obj("batch/v1", "Job", conditions=[("Failed", "True", "BackoffLimitExceeded")]), F,
     "BackoffLimitExceeded"),
    ("job suspended", obj("batch/v1", "Job", spec={"suspend": True}, conditions=[("Suspended", "True", "")]), C, ""),
    ("job not started", obj("batch/v1", "Job"), P, "JobNotStarted"),
    ("running job is current", obj("batch/v1", "Job", status={"startTime": "2026-01-01T00:00:00Z", "active": 1}),
     C, ""),
    # always current (CronJob in batch/v1beta1: the version is ignored), PDB
    ("cronjob v1beta1", obj("batch/v1beta1", "CronJob", conditions=[("Ready", "False", "x")]), C, ""),
    ("pdb v1beta1", obj("policy/v1beta1", "PodDisruptionBudget"), C, ""),
    ("secret", obj("v1", "Secret"), C, ""),
    # CRD
    ("crd names not accepted", obj("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                                   conditions=[("NamesAccepted", "False", "MultipleNamesNotAllowed")]),
     F, "MultipleNamesNotAllowed"),
    ("crd installing", obj("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                           conditions=[("NamesAccepted", "True", "NoConflicts"), ("Established", "False",
                                                                                   "Installing")]),
     P, "Installing"),
    ("crd not established", obj("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                                conditions=[("Established", "False", "Broken")]), F, "Broken"),
    ("crd established", obj("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                            conditions=[("Established", "True", "InitialNamesAccepted")]), C, ""),
    ("crd no conditions", obj("apiextensions.k8s.io/v1", "CustomResourceDefinition"), P, "Installing"),
    # 5. Ready for kinds without a rule
    ("ready true", obj("example.com/v1", "Widget", conditions=[("Ready", "True", "Up")]), C, ""),
    ("ready false", obj("example.com/v1", "Widget", conditions=[("Ready", "False", "Down")]), P, "Down"),
    ("ready unknown", obj("example.com/v1", "Widget", conditions=[("Ready", "Unknown", "")]), P, "NotReady"),
    # 6. else current
    ("plain custom resource", obj("example.com/v1", "Widget"), C, ""),
    ("configmap", obj("v1", "ConfigMap"), C, ""),
]


@pytest.mark.parametrize(("obj", "health", "reason"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_kstatus_rule(obj: dict[str, Any], health: Health, reason: str) -> None:
    v = compute(obj, now=NOW)
    assert v.health is health, v
    assert v.reason == reason, v


def test_group_given_overrides_api_version() -> None:
    """A watch event's group is known: a kind of the same name in another group gets no rule."""
    d = obj("apps/v1", "Deployment", spec={"replicas": 3})
    assert compute(d, now=NOW).health is P
    assert compute(d, group="example.com", now=NOW).health is C


def test_generation_check_comes_before_the_kind_rule() -> None:
    """A status written before the latest generation was observed is never taken as the health."""
    d = deploy(conditions=GOOD)
    d["metadata"]["generation"] = 2
    d["status"]["observedGeneration"] = 1
    assert compute(d, now=NOW).reason == "LatestGenerationNotObserved"
    failed = deploy(conditions=[("Progressing", "False", "ProgressDeadlineExceeded")])
    failed["metadata"]["generation"] = 2
    failed["status"]["observedGeneration"] = 1
    assert compute(failed, now=NOW).health is P  # the old generation's failure is not the new one's


def test_list_items_without_kind_are_judged_by_the_kind_given() -> None:
    """The items of a list response carry no ``apiVersion``/``kind``: the watch passes them in."""
    d = obj("apps/v1", "Deployment", spec={"replicas": 1}, status={"replicas": 1, "updatedReplicas": 1})
    del d["apiVersion"], d["kind"]
    assert compute(d, now=NOW).health is C  # no rule found: what the kind must prevent
    assert compute(d, group="apps", kind="Deployment", now=NOW).reason == "LessAvailable"
