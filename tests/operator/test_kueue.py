"""Kueue done right on the elastic backend (issue 21, points 0 and 5), against the fake's Kueue.

The fake plays Kueue as its source does (fake_cluster.py, `kueue_sync`,
`admit`, `kueue_preempt`): its webhook gates each queued pod and puts its
finalizer on it, it lets a failed pod go only once a replacement exists,
finishes a group only when all pods succeeded or one is not retriable in
group, stops a deleted Workload's pods and finalizes them, and stops a
deactivated or preempted Workload's pods but leaves their finalizers on.
Every scenario ends with no pod left on Kueue's finalizer that nothing
will take off.
"""

import kopf
import pytest
from fake_cluster import FakeCluster
from test_handlers import context
from test_reconcile import NS, manifest, step

from brain_operator import handlers
from brain_operator.cluster.api import Conflict
from brain_operator.objects.schedulers import (ADMISSION_GATE, KUEUE_POD_FINALIZER, POD_GROUP_COUNT_ANNOTATION,
                                       RETRIABLE_IN_GROUP_ANNOTATION)
from brain_operator.spec import KIND

QUEUE = {"queueName": "q"}


def queued_job(nodes=2, **spec):
    return manifest(nodes=nodes, scheduling=QUEUE, **spec)


def admitted(cluster, job):
    """The job created, its group admitted by Kueue, each pod on its own node and running."""
    cluster.apply_job(job)
    step(cluster)
    cluster.admit()
    for name in cluster.pods():
        cluster.place(name, f"node-{name}")
    cluster.run_all()
    assert step(cluster)["phase"] == "Running"
    return cluster


def finalized(pod):
    return KUEUE_POD_FINALIZER not in (pod["metadata"].get("finalizers") or ())


def condition(obj, kind):
    return next(c for c in obj["status"]["conditions"] if c["type"] == kind)


# ---- the fake's Kueue, as Kueue's source behaves ----


def test_kueues_webhook_gates_and_holds_each_queued_pod_and_its_workload_is_named_after_the_group():
    cluster = FakeCluster(kueue=True)
    cluster.apply_job(queued_job())
    step(cluster)
    for pod in cluster.pods().values():
        assert pod["spec"]["schedulingGates"] == [{"name": ADMISSION_GATE}]
        assert pod["metadata"]["finalizers"] == [KUEUE_POD_FINALIZER]
        assert pod["metadata"]["labels"]["kueue.x-k8s.io/managed"] == "true"
    cluster.kueue_sync()
    workload = cluster.workload("j")
    assert workload["spec"] == {"active": True, "podSets": [{"name": "main", "count": 2}]}
    assert {o["name"] for o in workload["metadata"]["ownerReferences"]} == {"j-worker-0", "j-worker-1"}
    assert all(pod["spec"]["schedulingGates"] for pod in cluster.pods().values())  # not admitted yet
    cluster.admit()
    assert condition(workload, "QuotaReserved")["status"] == "True"
    assert not any(pod["spec"]["schedulingGates"] for pod in cluster.pods().values())


def test_kueue_keeps_a_failed_pod_until_a_replacement_exists_so_a_same_name_replacement_never_comes():
    cluster = admitted(FakeCluster(kueue=True), queued_job())
    cluster.exit_pod("j-worker-1", 1)
    cluster.delete(next(r for r in cluster.objects if r.name == "j-worker-1"))
    for _ in range(3):
        cluster.kueue_sync()
    assert not finalized(cluster.pods()["j-worker-1"])  # Terminating for good
    with pytest.raises(Conflict, match="held by an object being deleted"):
        cluster.create(cluster.pods()["j-worker-1"])
    assert cluster.writes[-1][0] == "already_exists"


def test_deactivating_a_pod_groups_workload_stops_its_pods_but_leaves_them_on_the_finalizer():
    cluster = admitted(FakeCluster(kueue=True), queued_job())
    cluster.workload("j")["spec"]["active"] = False
    cluster.kueue_sync()
    cluster.kubelet_confirms()
    cluster.kueue_sync()
    pods = cluster.pods()
    assert set(pods) == {"j-worker-0", "j-worker-1"}
    assert all(p["status"]["phase"] == "Failed" and not finalized(p) for p in pods.values())
    assert condition(cluster.workload("j"), "QuotaReserved")["status"] == "False"


# ---- the operator under Kueue ----


def test_a_failed_worker_is_replaced_at_once_under_a_new_name_and_kueue_lets_the_failed_pod_go():
    cluster = admitted(FakeCluster(kueue=True), queued_job())
    cluster.exit_pod("j-worker-1", 1)
    status = step(cluster)  # the same instant: no wait for a stuck margin
    assert status["phase"] == "Restarting" and status["restarts"] == 1
    fresh = cluster.pods()["j-worker-1-1"]
    assert fresh["spec"]["hostname"] == "j-worker-1"
    assert fresh["metadata"]["annotations"][POD_GROUP_COUNT_ANNOTATION] == "2"
    cluster.kueue_sync()  # a replacement exists: Kueue finalizes the failed pod, and the admitted group ungates it
    assert "j-worker-1" not in cluster.pods()
    assert not cluster.pods()["j-worker-1-1"]["spec"]["schedulingGates"]
    cluster.place("j-worker-1-1", "node-9")
    cluster.run_all()
    assert step(cluster)["phase"] == "Running"
    mark = len(cluster.writes)
    status = step(cluster)
    assert [w for w in cluster.writes[mark:] if w[1].kind != KIND] == [] and status["restarts"] == 1


def test_a_failed_job_ends_its_group_so_kueue_releases_the_quota_and_every_finalizer_at_once():
    cluster = admitted(FakeCluster(kueue=True), queued_job(runPolicy={"backoffLimit": 0}))
    cluster.exit_pod("j-worker-1", 1)
    assert step(cluster)["phase"] == "Failed"
    for pod in cluster.pods().values():
        assert pod["metadata"]["annotations"][RETRIABLE_IN_GROUP_ANNOTATION] == "false"
    cluster.kubelet_confirms()  # the running sibling stops
    cluster.kueue_sync()
    workload = cluster.workload("j")
    assert condition(workload, "Finished")["status"] == "True"
    assert condition(workload, "QuotaReserved")["status"] == "False"
    # The failed pod stays for its logs, held by nothing; its stopped sibling is gone.
    assert list(cluster.pods()) == ["j-worker-1"] and finalized(cluster.pods()["j-worker-1"])
    mark = len(cluster.writes)
    step(cluster)
    assert [w for w in cluster.writes[mark:] if w[1].kind != KIND] == []


def test_without_the_group_ended_a_failed_jobs_pods_would_hold_the_quota_forever():
    """The control: the same failure, Kueue as it is, and nobody annotating the pods."""
    cluster = admitted(FakeCluster(kueue=True), queued_job())
    cluster.exit_pod("j-worker-1", 1)
    cluster.delete(next(r for r in cluster.objects if r.name == "j-worker-0"))
    cluster.kubelet_confirms()
    cluster.kueue_sync()
    assert condition(cluster.workload("j"), "QuotaReserved")["status"] == "True"
    assert not any(finalized(p) for p in cluster.pods().values())


def test_suspend_ends_the_group_and_resume_starts_a_new_one():
    cluster = admitted(FakeCluster(kueue=True), queued_job())
    cluster.apply_job(queued_job(runPolicy={"suspend": True}))
    mark = len(cluster.writes)
    step(cluster)
    assert ("delete", next(r for r in cluster.objects if r.kind == "Workload")) in cluster.writes[mark:]
    cluster.kubelet_confirms()
    cluster.kueue_sync()
    assert cluster.pods() == {} and cluster.workload("j") is None
    assert step(cluster)["phase"] == "Suspended"
    cluster.apply_job(queued_job(runPolicy={"suspend": False}))
    step(cluster)
    assert set(cluster.pods()) == {"j-worker-0", "j-worker-1"}
    cluster.admit()  # a new Workload for the new group, admitted
    assert condition(cluster.workload("j"), "QuotaReserved")["status"] == "True"
    assert not any(pod["spec"]["schedulingGates"] for pod in cluster.pods().values())


def test_a_deleted_job_ends_its_group_so_no_pod_stays_on_kueues_finalizer():
    cluster = admitted(FakeCluster(kueue=True), queued_job())
    job = cluster.delete_job("j")
    handlers.on_job_event(type="DELETED", body=job, memo=kopf.Memo(context=context(cluster)))
    cluster.collect_garbage()
    cluster.kubelet_confirms()
    cluster.kueue_sync()
    assert cluster.pods() == {} and cluster.workload("j") is None
    assert [r.kind for r in cluster.objects if r.namespace == NS and r.kind in ("Pod", "Workload")] == []


def test_kueue_preempting_the_group_is_free_and_the_replacements_wait_for_readmission_under_new_names():
    cluster = admitted(FakeCluster(kueue=True), queued_job())
    cluster.kueue_preempt("j")
    status = step(cluster)  # the pods are stopping: preempted, not failures
    assert status["restarts"] == 0
    cluster.kubelet_confirms()  # stopped, Failed, and kept by Kueue's finalizer
    status = step(cluster)
    assert status["restarts"] == 0
    assert {"j-worker-0-1", "j-worker-1-1"} <= set(cluster.pods())
    cluster.kueue_sync()
    assert set(cluster.pods()) == {"j-worker-0-1", "j-worker-1-1"}  # Kueue let the preempted pods go
    assert step(cluster)["phase"] == "Queued"
    cluster.admit()
    for name in cluster.pods():
        cluster.place(name, f"node-{name}")
    cluster.run_all()
    status = step(cluster)
    assert status["phase"] == "Running" and status["restarts"] == 0
