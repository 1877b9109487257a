"""The health of one Kubernetes object, by kstatus' rules in kstatus' order (pure: an object in, a verdict out).

The order (cli-utils ``pkg/kstatus/status``, which Flux uses; Argo CD differs in places, see the plugin README):

1. ``metadata.deletionTimestamp`` set → ``terminating``.
2. ``metadata.generation`` and ``status.observedGeneration`` both present and different → ``progressing``
   (``LatestGenerationNotObserved``): a status written before the latest spec was seen says nothing about it.
3. Condition ``Reconciling=True`` → ``progressing``; ``Stalled=True`` → ``failed`` (absent: nothing).
4. The rule of the kind, keyed by group and kind (the version is ignored, as kstatus does).
5. Kinds without a rule: condition ``Ready`` True → ``current``, False/Unknown → ``progressing``.
6. Else ``current`` (a ConfigMap, a Secret: nothing to wait for).

Surprises kept on purpose (they are kstatus'): a running Job is current; a Pod that failed is current (its
owner judges it); a ReplicaSet's ``ReplicaFailure`` is progressing, not failed; a Deployment needs
``Progressing=True/NewReplicaSetAvailable`` (``progressDeadlineSeconds`` defaults to 600, so always).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = ["POD_UNSCHEDULABLE_GRACE", "Health", "Verdict", "compute"]

POD_UNSCHEDULABLE_GRACE = 15.0
"""Seconds an unschedulable Pod is progressing after its creation before it is failed (kstatus' figure)."""
_MAX_INT32 = 2**31 - 1


class Health(enum.Enum):
    """The health of one object (kstatus' statuses, less those only a poller gives)."""

    CURRENT = "current"
    """Reconciled: what the object asks for is there."""
    PROGRESSING = "progressing"
    """Not there yet (kstatus' InProgress)."""
    FAILED = "failed"
    """Will not get there without a change (a deadline exceeded, a crash loop, a Job failed)."""
    TERMINATING = "terminating"
    """Being deleted."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """One object's health with the reason and message that explain it (``reason`` is a condition reason or
    kstatus' own, e.g. ``LatestGenerationNotObserved``)."""

    health: Health
    reason: str = ""
    message: str = ""


_CURRENT = Verdict(Health.CURRENT)
Obj = Mapping[str, Any]


def _map(value: object) -> Obj:
    return value if isinstance(value, Mapping) else {}


def _int(obj: Obj, *path: str, default: int = 0) -> int:
    cur: object = obj
    for key in path:
        if not isinstance(cur, Mapping) or key not in cur:
            return default
        cur = cur[key]
    return cur if isinstance(cur, int) and not isinstance(cur, bool) else default


def _condition(obj: Obj, kind: str) -> Obj | None:
    for c in _map(obj.get("status")).get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == kind:
            return c
    return None


def _is(obj: Obj, kind: str, status: str = "True") -> Obj | None:
    c = _condition(obj, kind)
    return c if c is not None and c.get("status") == status else None


def _why(c: Obj, default: str = "") -> tuple[str, str]:
    return str(c.get("reason") or default), str(c.get("message") or "")


def _progressing(reason: str, message: str) -> Verdict:
    return Verdict(Health.PROGRESSING, reason, message)


def _counts(spec: int, label: str, pairs: list[tuple[str, int]]) -> Verdict | None:
    """The first of ``pairs`` short of ``spec`` replicas, as kstatus words it."""
    for what, n in pairs:
        if spec > n:
            return _progressing(f"Less{what}", f"{label}: {what.lower()} {n} of {spec}")
    return None


def _deployment(obj: Obj) -> Verdict:
    spec_replicas = _int(obj, "spec", "replicas", default=1)
    st = _map(obj.get("status"))
    for c in st.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded":
            return Verdict(Health.FAILED, "ProgressDeadlineExceeded", str(c.get("message") or ""))
    replicas, updated = _int(st, "replicas"), _int(st, "updatedReplicas")
    available, ready = _int(st, "availableReplicas"), _int(st, "readyReplicas")
    if spec_replicas > replicas:
        return _progressing("LessReplicas", f"replicas: {replicas} of {spec_replicas}")
    if spec_replicas > updated:
        return _progressing("LessUpdated", f"updated replicas: {updated} of {spec_replicas}")
    if replicas > spec_replicas:
        return _progressing("ExtraPods", f"pending termination: {replicas - spec_replicas}")
    if updated > available:
        return _progressing("LessAvailable", f"available replicas: {available} of {updated}")
    if spec_replicas > ready:
        return _progressing("LessReady", f"ready replicas: {ready} of {spec_replicas}")
    deadline = _map(obj.get("spec")).get("progressDeadlineSeconds")
    if deadline is not None and deadline != _MAX_INT32:
        p = _condition(obj, "Progressing")
        if p is None or p.get("status") != "True" or p.get("reason") != "NewReplicaSetAvailable":
            return _progressing("NewReplicaSetNotAvailable", str((p or {}).get("message") or
                                                                 "waiting for the new ReplicaSet to be available"))
    if _is(obj, "Available") is None:
        return _progressing("NotAvailable", "Deployment is not Available")
    return _CURRENT


def _statefulset(obj: Obj) -> Verdict:
    spec = _map(obj.get("spec"))
    strategy = _map(spec.get("updateStrategy"))
    if strategy.get("type") == "OnDelete":
        return _CURRENT
    want = _int(obj, "spec", "replicas", default=1)
    st = _map(obj.get("status"))
    replicas = _int(st, "replicas")
    got = _counts(want, "StatefulSet", [("Replicas", replicas), ("Ready", _int(st, "readyReplicas"))])
    if got is not None:
        return got
    if replicas > want:
        return _progressing("ExtraPods", f"pending termination: {replicas - want}")
    rolling = _map(strategy.get("rollingUpdate"))
    if "partition" in rolling:
        partition = _int(rolling, "partition")
        if _int(st, "updatedReplicas") < want - partition:
            return _progressing("PartitionRollout", f"updated replicas: {_int(st, 'updatedReplicas')} of "
                                                    f"{want - partition}")
        return _CURRENT
    if _int(st, "currentReplicas") < want:
        return _progressing("LessCurrent", f"current replicas: {_int(st, 'currentReplicas')} of {want}")
    if st.get("currentRevision") != st.get("updateRevision"):
        return _progressing("RevisionMismatch", "waiting for the update to roll out")
    return _CURRENT


def _daemonset(obj: Obj) -> Verdict:
    meta, st = _map(obj.get("metadata")), _map(obj.get("status"))
    if "generation" not in meta or "observedGeneration" not in st:
        return _progressing("LatestGenerationNotObserved", "DaemonSet generation not observed yet")
    if "desiredNumberScheduled" not in st:
        return _progressing("NoDesiredNumber", "desiredNumberScheduled not set yet")
    desired = _int(st, "desiredNumberScheduled")
    got = _counts(desired, "DaemonSet", [
        ("Current", _int(st, "currentNumberScheduled")), ("Updated", _int(st, "updatedNumberScheduled")),
        ("Available", _int(st, "numberAvailable")), ("Ready", _int(st, "numberReady"))])
    return got or _CURRENT


def _replicaset(obj: Obj) -> Verdict:
    if (c := _is(obj, "ReplicaFailure")) is not None:
        return _progressing(*_why(c, "ReplicaFailure"))
    want = _int(obj, "spec", "replicas", default=1)
    st = _map(obj.get("status"))
    got = _counts(want, "ReplicaSet", [
        ("Labelled", _int(st, "fullyLabeledReplicas")), ("Available", _int(st, "availableReplicas")),
        ("Ready", _int(st, "readyReplicas"))])
    return got or _CURRENT


def _pod(obj: Obj, now: datetime) -> Verdict:
    st = _map(obj.get("status"))
    phase = st.get("phase")
    if phase in ("Succeeded", "Failed"):
        return Verdict(Health.CURRENT, f"Pod{phase}", str(st.get("message") or ""))
    if phase == "Running":
        if _is(obj, "Ready") is not None:
            return _CURRENT
        for cs in st.get("containerStatuses") or ():
            waiting = _map(_map(_map(cs).get("state")).get("waiting"))
            if waiting.get("reason") == "CrashLoopBackOff":
                return Verdict(Health.FAILED, "CrashLoopBackOff", str(waiting.get("message") or
                                                                      f"container {_map(cs).get('name')} crash-loops"))
        return _progressing("PodRunningNotReady", "Pod is running but not ready")
    if phase == "Pending":
        c = _is(obj, "PodScheduled", "False")
        if c is not None and c.get("reason") == "Unschedulable":
            created = _time(_map(obj.get("metadata")).get("creationTimestamp"))
            if created is not None and (now - created).total_seconds() > POD_UNSCHEDULABLE_GRACE:
                return Verdict(Health.FAILED, "Unschedulable", str(c.get("message") or ""))
            return _progressing("Unschedulable", str(c.get("message") or ""))
        return _progressing("PodPending", "Pod is pending")
    return _progressing("PodNoPhase", "Pod has no phase yet")


def _pvc(obj: Obj, now: datetime) -> Verdict:
    phase = _map(obj.get("status")).get("phase")
    return _CURRENT if phase == "Bound" else _progressing("NotBound", f"PersistentVolumeClaim is {phase or 'Pending'}")


def _service(obj: Obj, now: datetime) -> Verdict:
    spec = _map(obj.get("spec"))
    if spec.get("type") == "LoadBalancer" and not spec.get("clusterIP"):
        return _progressing("NoClusterIP", "ClusterIP not set")
    return _CURRENT


def _job(obj: Obj, now: datetime) -> Verdict:
    if (c := _is(obj, "Complete")) is not None:
        return Verdict(Health.CURRENT, *_why(c, "Complete"))
    if (c := _is(obj, "Failed")) is not None:
        return Verdict(Health.FAILED, *_why(c, "JobFailed"))
    if _is(obj, "Suspended") is not None and _map(obj.get("spec")).get("suspend") is True:
        return _CURRENT
    if not _map(obj.get("status")).get("startTime"):
        return _progressing("JobNotStarted", "Job not started")
    return _CURRENT


def _crd(obj: Obj, now: datetime) -> Verdict:
    if (c := _is(obj, "NamesAccepted", "False")) is not None:
        return Verdict(Health.FAILED, *_why(c, "NamesNotAccepted"))
    c = _condition(obj, "Established")
    if c is not None and c.get("status") == "False" and c.get("reason") != "Installing":
        return Verdict(Health.FAILED, *_why(c, "NotEstablished"))
    if c is not None and c.get("status") == "True":
        return _CURRENT
    return _progressing("Installing", str((c or {}).get("message") or "CRD is being installed"))


def _always(obj: Obj, now: datetime) -> Verdict:
    return _CURRENT


def _no_clock(rule: Callable[[Obj], Verdict]) -> Callable[[Obj, datetime], Verdict]:
    return lambda obj, now: rule(obj)


_RULES: dict[tuple[str, str], Callable[[Obj, datetime], Verdict]] = {
    ("apps", "Deployment"): _no_clock(_deployment),
    ("apps", "StatefulSet"): _no_clock(_statefulset),
    ("apps", "DaemonSet"): _no_clock(_daemonset),
    ("apps", "ReplicaSet"): _no_clock(_replicaset),
    ("", "Pod"): _pod,
    ("", "PersistentVolumeClaim"): _pvc,
    ("", "Service"): _service,
    ("batch", "Job"): _job,
    ("batch", "CronJob"): _always,
    ("", "ConfigMap"): _always,
    ("", "Secret"): _always,
    ("policy", "PodDisruptionBudget"): _always,
    ("apiextensions.k8s.io", "CustomResourceDefinition"): _crd,
}


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def _group(obj: Obj) -> str:
    api_version = str(obj.get("apiVersion") or "")
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def compute(obj: Obj, *, group: str | None = None, kind: str | None = None, now: datetime | None = None) -> Verdict:
    """The health of ``obj`` (a listed, watched or applied object), kstatus' six steps in order.

    Args:
        obj: The object as the API server returned it.
        group: Its API group, if known better than from ``apiVersion``.
        kind: Its kind, if known better than from ``kind``: the items of a list carry neither field.
        now: The clock for the one time-dependent rule (an unschedulable Pod); UTC now by default.
    """
    meta, st = _map(obj.get("metadata")), _map(obj.get("status"))
    if meta.get("deletionTimestamp"):
        return Verdict(Health.TERMINATING, "Terminating", "deletion in progress")
    generation, observed = meta.get("generation"), st.get("observedGeneration")
    if generation is not None and observed is not None and generation != observed:
        return _progressing("LatestGenerationNotObserved",
                            f"generation {generation} not observed yet (observed {observed})")
    if (c := _is(obj, "Reconciling")) is not None:
        return _progressing(*_why(c, "Reconciling"))
    if (c := _is(obj, "Stalled")) is not None:
        return Verdict(Health.FAILED, *_why(c, "Stalled"))
    rule = _RULES.get((_group(obj) if group is None else group, kind or str(obj.get("kind") or "")))
    if rule is not None:
        return rule(obj, now or datetime.now(UTC))
    ready = _condition(obj, "Ready")
    if ready is not None:
        if ready.get("status") == "True":
            return _CURRENT
        return _progressing(*_why(ready, "NotReady"))
    return _CURRENT
