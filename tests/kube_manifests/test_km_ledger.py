"""The drift judge on managedFields as kube-apiserver v1.20.2 writes them (shapes copied from its answers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reloadd_kube_manifests._applyset import ObjRef, applyset_id
from reloadd_kube_manifests._ledger import Ledger, field_paths, owned_hash
from reloadd_kube_manifests._outcome import FileOutcome, applyset_of

from reloadd import Fingerprint, PathRecord

REF = ObjRef("apps", "Deployment", "web", "app")
FILE = Path("/m/app.yaml")

OURS = {"f:metadata": {"f:labels": {"f:applyset.kubernetes.io/part-of": {}}},
        "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {
            'k:{"name":"app"}': {".": {}, "f:image": {}, "f:name": {}}}}}}}


def obj(rv: int, managed: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "app", "namespace": "web", "resourceVersion": str(rv), "managedFields": managed}}


def entry(manager: str, fields: dict[str, Any], op: str = "Apply",
          time: str = "2026-12-03T04:00:00Z") -> dict[str, Any]:
    return {"manager": manager, "operation": op, "apiVersion": "apps/v1", "time": time, "fieldsType": "FieldsV1",
            "fieldsV1": fields}


def test_field_paths_name_list_items_by_key() -> None:
    assert field_paths(OURS) == {"metadata.labels.applyset.kubernetes.io/part-of", "spec.replicas",
                                 "spec.template.spec.containers[name=app].image",
                                 "spec.template.spec.containers[name=app].name"}


def test_drift_is_a_lost_field_or_a_deleted_member_never_an_added_one_or_our_own_write() -> None:
    ledger = Ledger("reloadd")
    applied = obj(10, [entry("reloadd", OURS)])
    owned = ledger.applied(FILE, "set-1", {REF: applied})
    assert owned == {str(REF): owned_hash(applied, "reloadd")}
    assert ledger.judge("MODIFIED", REF, applied) is None  # our own apply's event
    label = obj(11, [entry("reloadd", OURS), entry("kubectl-label", {"f:metadata": {"f:labels": {"f:team": {}}}},
                                                         "Update", "2026-12-03T04:01:00Z")])
    assert ledger.judge("MODIFIED", REF, label) is None  # another manager's new field: not drift
    lost = {**OURS, "f:spec": {**OURS["f:spec"]}}
    del lost["f:spec"]["f:replicas"]
    patched = obj(12, [entry("reloadd", lost), entry("kubectl-patch", {"f:spec": {"f:replicas": {}}}, "Update",
                                                    "2026-12-03T04:02:00Z")])
    got = ledger.judge("MODIFIED", REF, patched)
    assert got is not None and got[0] == FILE
    assert (got[1].kind, got[1].what, got[1].why, got[1].by) == (
        "object", "Deployment.apps web/app", "spec.replicas changed", "kubectl-patch (Update)")
    assert ledger.judge("MODIFIED", REF, obj(9, [])) is None  # older than our apply: stale
    assert ledger.judge("DELETED", REF, patched) is not None
    assert ledger.judge("DELETED", ObjRef("", "ConfigMap", "web", "other"), None) is None  # not a member


def test_events_during_an_apply_wait_for_its_answer() -> None:
    ledger = Ledger("reloadd")
    ledger.applied(FILE, "set-1", {REF: obj(10, [entry("reloadd", OURS)])})
    ledger.begin(FILE)
    new = {**OURS, "f:data": {}}
    ledger.judge("MODIFIED", REF, obj(11, [entry("reloadd", new)]))  # our apply's own event, before its answer
    ledger.applied(FILE, "set-1", {REF: obj(11, [entry("reloadd", new)])})
    assert ledger.end(FILE) == []


def test_records_restore_the_baseline_and_old_records_are_named() -> None:
    ledger = Ledger("reloadd")
    live = obj(10, [entry("reloadd", OURS)])
    fp = Fingerprint(1, 1, 1, 1)
    bare = ledger.load([
        (FILE, PathRecord(fp, None, {"applyset": "set-1", "owned": {str(REF): owned_hash(live, "reloadd")}})),
        (Path("/m/old.yaml"), PathRecord(fp, None, {"applyset": "set-2", "applied": 1})),
    ])
    assert bare == [Path("/m/old.yaml")]
    assert ledger.judge("MODIFIED", REF, live) is None
    taken = obj(11, [entry("someone", OURS, "Update")])
    got = ledger.judge("MODIFIED", REF, taken)
    assert got is not None and "taken over" in got[1].why and got[1].by == "someone (Update)"


def test_a_record_names_its_applyset_through_its_parent_as_older_records_named_it_outright() -> None:
    """The record keeps the parent, not the ApplySet id it is derived from (~70 bytes a file); records written
    with the id outright still load, each restoring its members under the set its objects are labelled with."""
    name = "reloadd-app-yaml-0123456789"
    out = FileOutcome(f"kube-system/{name}", applyset_id(name, "kube-system"))
    data = out.to_data()
    assert "applyset" not in data and applyset_of(data) == out.applyset
    live = obj(10, [entry("reloadd", OURS)])
    other = ObjRef("", "ConfigMap", "ns", "other")
    owned = owned_hash(live, "reloadd")
    ledger = Ledger("reloadd")
    fp = Fingerprint(1, 1, 1, 1)
    assert ledger.load([
        (FILE, PathRecord(fp, None, {**data, "owned": {str(REF): owned}})),
        (Path("/m/old.yaml"), PathRecord(fp, None, {"parent": "kube-system/x", "applyset": "set-2",
                                                    "owned": {str(other): owned}})),
        (Path("/m/none.yaml"), PathRecord(fp, None, {"applied": 0, "owned": {}})),
    ]) == []
    assert ledger.members[REF].applyset == out.applyset and ledger.members[other].applyset == "set-2"
    assert applyset_of({"parent": "no-namespace"}) is None and applyset_of({"parent": "ns/"}) is None


def test_a_huge_field_set_keeps_only_its_hash() -> None:
    """A CRD's schema is owned field by field: the ledger keeps its hash, not the tree, and still sees drift."""
    ledger = Ledger("reloadd")
    huge = {"f:spec": {f"f:p{i}": {} for i in range(3000)}}
    ledger.applied(FILE, "set-1", {REF: obj(10, [entry("reloadd", huge)])})
    assert ledger.members[REF].fields is None and ledger.members[REF].owned is not None
    smaller = {"f:spec": {f"f:p{i}": {} for i in range(2999)}}
    got = ledger.judge("MODIFIED", REF, obj(11, [entry("reloadd", smaller), entry("edit", {"f:spec": {"f:p2999": {}}},
                                                                                  "Update")]))
    assert got is not None and got[1].why == "fields reloadd applies changed" and got[1].by == "edit (Update)"
