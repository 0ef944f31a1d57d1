"""The fake's shared cluster as Kueue and Kubernetes behave (issue 33, before any fix): each rule a later test leans
on, shown on the fake alone, so a fix is never tested against a cluster kinder than the real one.

Kueue's excess-pod rule for a lost node's pod still Running, its Finished rule for a group with such a pod, the
`integrations.frameworks` switch, a job deleted while no operator runs, and a watch's relist gap.
"""

import copy
from datetime import timedelta

import pytest
from fake_cluster import POD_FRAMEWORK, PYTORCHJOB_FRAMEWORK, FakeCluster, Watch
from test_kueue import admitted, finalized, queued_job
from test_reconcile import NS, T0, manifest, step

from brain_operator.cluster.api import Conflict
from brain_operator.objects.refs import ObjectRef
from brain_operator.objects.schedulers import ADMISSION_GATE, RETRIABLE_IN_GROUP_ANNOTATION, WORKLOAD
from brain_operator.spec import API_VERSION, KIND


def pod_ref(name):
    return ObjectRef("v1", "Pod", NS, name)


def replacement_of(cluster, name, new_name):
    """A copy of pod `name` under `new_name`, created as the operator creates a replacement (Kueue's webhook gates it)."""
    pod = copy.deepcopy(cluster.pods()[name])
    pod["metadata"] = {k: v for k, v in pod["metadata"].items() if k in ("labels", "annotations", "ownerReferences")}
    pod["metadata"].update(name=new_name, namespace=NS)
    pod["spec"] = {k: v for k, v in pod["spec"].items() if k not in ("nodeName", "schedulingGates")}
    pod.pop("status", None)
    return cluster.create(pod)


def test_kueue_deletes_the_gated_replacement_of_a_lost_nodes_pod_while_that_pod_is_still_running():
    cluster = admitted(FakeCluster(kueue=True), queued_job())
    cluster.lose_node("node-j-worker-1")  # Terminating for good, phase still Running, Kueue's finalizer on
    cluster.now = T0 + timedelta(seconds=1)
    replacement_of(cluster, "j-worker-1", "j-worker-1-1")
    cluster.kueue_sync()
    # sortActivePods keeps the finalized, ungated, older pod: the replacement is the excess one, and goes.
    assert "j-worker-1-1" not in cluster.pods() and not finalized(cluster.pods()["j-worker-1"])


def test_once_the_lost_pod_is_failed_through_its_status_kueue_keeps_the_replacement_and_lets_the_old_pod_go():
    cluster = admitted(FakeCluster(kueue=True), queued_job())
    cluster.lose_node("node-j-worker-1")
    stuck = cluster.pods()["j-worker-1"]
    cluster.patch_pod_status(pod_ref("j-worker-1"), {"phase": "Failed"}, stuck["metadata"]["resourceVersion"])
    cluster.now = T0 + timedelta(seconds=1)
    replacement_of(cluster, "j-worker-1", "j-worker-1-1")
    cluster.kueue_sync()
    assert cluster.pods()["j-worker-1-1"]["spec"]["schedulingGates"] == []  # admitted group: ungated at once
    assert finalized(cluster.pods()["j-worker-1"])  # still Terminating: no kubelet confirms, PodGC has not run


def test_a_pods_status_patch_carries_its_resource_version_as_a_precondition():
    cluster = admitted(FakeCluster(kueue=True), queued_job())
    old = cluster.pods()["j-worker-0"]["metadata"]["resourceVersion"]
    cluster.set_pod("j-worker-0", "Running", ready=True)  # the kubelet wrote since
    with pytest.raises(Conflict):
        cluster.patch_pod_status(pod_ref("j-worker-0"), {"phase": "Failed"}, old)
    assert cluster.pods()["j-worker-0"]["status"]["phase"] == "Running"


def test_a_failed_groups_quota_is_held_while_a_lost_nodes_pod_still_runs():
    cluster = admitted(FakeCluster(kueue=True), queued_job())
    cluster.lose_node("node-j-worker-1")
    cluster.exit_pod("j-worker-0", 1)
    for name in cluster.pods():
        cluster.patch(pod_ref(name), {"metadata": {"annotations": {RETRIABLE_IN_GROUP_ANNOTATION: "false"}}})
    cluster.kueue_sync()
    conditions = {c["type"] for c in cluster.workload("j")["status"]["conditions"] if c["status"] == "True"}
    assert "Finished" not in conditions and "QuotaReserved" in conditions
    stuck = cluster.pods()["j-worker-1"]
    cluster.patch_pod_status(pod_ref("j-worker-1"), {"phase": "Failed"}, stuck["metadata"]["resourceVersion"])
    cluster.kueue_sync()
    assert any(c["type"] == "Finished" and c["status"] == "True" for c in cluster.workload("j")["status"]["conditions"])


def test_kueue_leaves_a_queued_kind_alone_when_its_integration_is_not_enabled():
    cluster = FakeCluster(kueue=True, kueue_frameworks=[POD_FRAMEWORK])
    pytorchjob = cluster.create({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {
        "name": "j", "namespace": NS, "labels": {"kueue.x-k8s.io/queue-name": "q"}}, "spec": {"runPolicy": {}}})
    cluster.kueue_sync()
    assert not pytorchjob["spec"]["runPolicy"].get("suspend")  # would run at once, outside any quota
    assert not [r for r in cluster.objects if (r.api_version, r.kind) == WORKLOAD]
    pods = FakeCluster(kueue=True, kueue_frameworks=[PYTORCHJOB_FRAMEWORK])
    pods.apply_job(queued_job())
    step(pods)
    assert not any(g["name"] == ADMISSION_GATE for p in pods.pods().values() for g in p["spec"].get("schedulingGates") or ())


def test_a_job_deleted_while_no_operator_runs_goes_unless_a_finalizer_holds_it_and_nobody_is_told():
    cluster = FakeCluster()
    cluster.apply_job(manifest())
    step(cluster)
    writes = len(cluster.writes)
    cluster.delete_job("j")
    assert cluster.get_job(NS, "j") is None and len(cluster.writes) == writes
    cluster.apply_job(manifest(name="k"))
    cluster.patch(ObjectRef(API_VERSION, KIND, NS, "k"), {"metadata": {"finalizers": ["brain.ai/cleanup"]}})
    cluster.delete_job("k")
    assert cluster.get_job(NS, "k")["metadata"]["deletionTimestamp"]
    cluster.remove_finalizer("k", "brain.ai/cleanup", kind=KIND)
    assert cluster.get_job(NS, "k") is None


def worker_2_lost_in_a_relist_gap(cluster):
    """A 3-worker job's watch breaks while its unscheduled worker 2 is deleted (gone at once): its DELETED is lost."""
    cluster.apply_job(manifest(nodes=3))
    step(cluster)
    watch = Watch(cluster)
    watch.gap()
    cluster.delete(pod_ref("j-worker-2"))
    watch.relisted()
    return watch


def test_a_child_deleted_in_a_relist_gap_stays_in_the_watchs_index_for_good():
    cluster = FakeCluster()
    watch = worker_2_lost_in_a_relist_gap(cluster)
    for _ in range(3):
        watch.tick()
        names = sorted(p["metadata"]["name"] for p in watch(NS, "j", ("v1", "Pod")))
        assert names == ["j-worker-0", "j-worker-1", "j-worker-2"]
    assert "j-worker-2" not in cluster.pods()
