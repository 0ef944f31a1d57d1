"""Shared clusters, part 3 (issue 33), against the faithful fake: each point's operator behaviour over many passes.

The real kopf operator against kmock shows the same where the operator's own wiring is what is tested
(test_operator_kmock.py); the fake's rules themselves are shown in test_fake_shared_cluster.py.
"""

from datetime import timedelta

import kopf
from fake_cluster import KUEUE_FRAMEWORKS, POD_FRAMEWORK, FakeCluster
from test_fake_shared_cluster import worker_2_lost_in_a_relist_gap
from test_kueue import admitted, finalized, queued_job
from test_reconcile import NS, T0, condition, manifest, step

from brain_operator import handlers
from brain_operator.backends.kueue_integration import UNMANAGED_ANNOTATION
from brain_operator.backends.lost_pods import MESSAGE
from brain_operator.cluster.children import WATCHED_KINDS
from brain_operator.objects.names import JOB_NAME_LABEL
from brain_operator.objects.refs import ObjectRef
from brain_operator.objects.schedulers import WORKLOAD
from brain_operator.spec import OperatorDefaults
from brain_operator.status.waiting import EARLIER_JOB, STUCK_TERMINATING, TERMINATING_MARGIN_SECONDS

DEFAULTS = OperatorDefaults(image="img:1")

GRACE = 300  # the worker pods' rendered terminationGracePeriodSeconds
STUCK = T0 + timedelta(seconds=GRACE + TERMINATING_MARGIN_SECONDS)


# ---- 1. a lost node under Kueue recovers with no human ----


def test_a_lost_nodes_worker_under_kueue_is_failed_as_podgc_would_and_its_replacement_runs():
    cluster = admitted(FakeCluster(kueue=True), queued_job())
    cluster.lose_node("node-j-worker-1")
    step(cluster, STUCK - timedelta(seconds=1))
    assert cluster.pods()["j-worker-1"]["status"]["phase"] == "Running"  # within its grace and margin: untouched
    status = step(cluster, STUCK)
    stuck = cluster.pods()["j-worker-1"]
    assert stuck["status"]["phase"] == "Failed" and stuck["status"]["message"] == MESSAGE
    writes = [kind for kind, ref in cluster.writes if ref.name.startswith("j-worker-1")]
    assert writes[-2:] == ["patch_pod_status", "create"]  # Kueue counts it gone before the replacement exists
    ready = condition(status, "WorkersReady")
    assert ready["reason"] == STUCK_TERMINATING and "marks it Failed so Kueue counts it gone" in ready["message"]
    for _ in range(3):  # Kueue's passes: the replacement is not excess, and the old pod is let go
        cluster.kueue_sync()
        step(cluster, STUCK)
    assert cluster.pods()["j-worker-1-1"]["spec"]["schedulingGates"] == []
    assert finalized(cluster.pods()["j-worker-1"])
    cluster.place("j-worker-1-1", "node-9")
    cluster.set_pod("j-worker-1-1", "Running", ready=True)
    status = step(cluster, STUCK)
    assert status["phase"] == "Running" and status["restarts"] == 0
    assert len([w for w in cluster.writes if w[0] == "patch_pod_status"]) == 1


def test_a_failed_job_with_a_worker_on_a_lost_node_ends_its_kueue_group_and_frees_the_quota():
    cluster = admitted(FakeCluster(kueue=True), queued_job(runPolicy={"backoffLimit": 0}))
    cluster.lose_node("node-j-worker-1")
    cluster.exit_pod("j-worker-0", 1)
    assert step(cluster, T0)["phase"] == "Failed"
    cluster.kueue_sync()
    assert not any(c["type"] == "Finished" for c in cluster.workload("j")["status"]["conditions"])
    step(cluster, STUCK)  # the stuck pod marked Failed: none of the group runs
    cluster.kueue_sync()
    finished = next(c for c in cluster.workload("j")["status"]["conditions"] if c["type"] == "Finished")
    assert finished["status"] == "True" and all(finalized(p) for p in cluster.pods().values())



# ---- 2. a job deleted while the operator is down leaks nothing ----


def deleted_while_down(cluster):
    """A queued, admitted, running job deleted with no operator to see it: the garbage collector deletes its pods,
    their kubelets stop them, and Kueue's finalizer keeps them (and the group's quota) for good."""
    admitted(cluster, queued_job())
    cluster.delete_job("j")
    cluster.collect_garbage()
    cluster.kubelet_confirms()
    for _ in range(3):
        cluster.kueue_sync()
    assert sorted(cluster.pods()) == ["j-worker-0", "j-worker-1"] and cluster.workload("j") is not None


def test_an_operator_back_after_a_job_was_deleted_ends_its_kueue_group_on_the_pods_events():
    cluster = FakeCluster(kueue=True)
    deleted_while_down(cluster)
    context = handlers.Context(client=cluster, defaults=DEFAULTS, clock=lambda: T0)
    # kopf's start lists every child: each pod's event starts a pass for its job, which is gone.
    handlers.on_pod(labels={JOB_NAME_LABEL: "j"}, namespace=NS, memo=kopf.Memo(context=context))
    assert ("delete", ObjectRef(*WORKLOAD, NS, "j")) in cluster.writes
    cluster.kueue_sync()  # the Workload marked for deletion: Kueue stops and finalizes every pod of the group
    assert cluster.pods() == {} and cluster.workload("j") is None


def test_a_job_recreated_under_the_name_of_one_deleted_while_the_operator_was_down_starts():
    cluster = FakeCluster(kueue=True)
    deleted_while_down(cluster)
    cluster.apply_job(queued_job())
    status = step(cluster)
    assert status["reason"] == EARLIER_JOB and cluster.kinds().count("Pod") == 2
    assert ("delete", ObjectRef(*WORKLOAD, NS, "j")) in cluster.writes
    cluster.kueue_sync()
    step(cluster)
    cluster.admit()
    assert all(p["metadata"]["ownerReferences"][0]["uid"] == cluster.get_job(NS, "j")["metadata"]["uid"]
               for p in cluster.pods().values())
    assert sorted(cluster.pods()) == ["j-worker-0", "j-worker-1"]
    assert not any(p["spec"]["schedulingGates"] for p in cluster.pods().values())


# ---- 3. a queued PyTorchJob that Kueue does not manage ----


def pytorchjob(cluster):
    return next(o for r, o in cluster.objects.items() if r.kind == "PyTorchJob")


def test_a_queued_pytorchjob_kueue_does_not_manage_is_held_suspended_and_named_until_kueue_manages_it():
    cluster = FakeCluster(kueue=True, kueue_frameworks=[POD_FRAMEWORK])
    cluster.apply_job(manifest(backend="pytorchjob", scheduling={"queueName": "q"}))
    status = step(cluster)
    valid = condition(status, "Valid")
    assert status["phase"] == "Failed" and valid["status"] == "False" and valid["reason"] == "BackendUnavailable"
    assert "integrations.frameworks" in valid["message"] and '"kubeflow.org/pytorchjob"' in valid["message"]
    # Suspended by the operator in the pass that created it: it never runs outside the queue's quota.
    created_at = next(i for i, (kind, ref) in enumerate(cluster.writes) if kind == "create" and ref.kind == "PyTorchJob")
    assert cluster.writes[created_at + 1] == ("patch", ObjectRef.of(pytorchjob(cluster)))
    assert pytorchjob(cluster)["spec"]["runPolicy"]["suspend"] is True
    assert [e.reason for _, e in cluster.events if e.type == "Warning"].count("BackendUnavailable") == 1
    mark = len(cluster.writes)
    assert step(cluster) == status and cluster.writes[mark:] == []  # said once; nothing more written
    # Kueue's integration turned on: it makes a Workload for the suspended PyTorchJob and admits it.
    cluster.kueue_frameworks = frozenset(KUEUE_FRAMEWORKS)
    cluster.admit()
    assert pytorchjob(cluster)["spec"]["runPolicy"]["suspend"] is False
    status = step(cluster)
    assert condition(status, "Valid")["status"] == "True" and status["phase"] != "Failed"


def test_a_queued_pytorchjob_that_kueue_manages_is_left_to_kueue():
    cluster = FakeCluster(kueue=True)
    cluster.apply_job(manifest(backend="pytorchjob", scheduling={"queueName": "q"}))
    status = step(cluster)
    assert condition(status, "Valid")["status"] == "True"
    assert UNMANAGED_ANNOTATION not in (pytorchjob(cluster)["metadata"].get("annotations") or {})


# ---- 5. the smaller points ----


def test_a_kubelet_admission_rejection_is_named_with_its_reason_and_costs_nothing_by_default():
    cluster = FakeCluster()
    cluster.apply_job(manifest())
    step(cluster)
    cluster.reject_pod("j-worker-1", "UnexpectedAdmissionError", "Allocate failed due to no healthy devices present")
    status = step(cluster)
    assert status["restarts"] == 0 and "j-worker-1" not in [p for p in cluster.pods()
                                                             if cluster.pods()[p]["status"].get("phase") == "Failed"]
    (event,) = [e for _, e in cluster.events if e.reason == "WorkerFailed"]
    assert "admission-rejected: UnexpectedAdmissionError: Pod was rejected" in event.message
    assert "runPolicy.failurePolicy.admissionRejected: RestartNotCounted" in event.message
    charged = FakeCluster()
    charged.apply_job(manifest(runPolicy={"failurePolicy": {"admissionRejected": "Restart"}}))
    step(charged)
    charged.reject_pod("j-worker-1", "OutOfnvidia.com/gpu", "Node didn't have enough resource: nvidia.com/gpu")
    assert step(charged)["restarts"] == 1


def test_a_queued_jobs_deadline_starts_at_admission_as_a_jobs_start_time_does():
    cluster = FakeCluster(kueue=True)
    cluster.apply_job(queued_job(runPolicy={"activeDeadlineSeconds": 600}))
    step(cluster)
    cluster.kueue_sync()
    week = T0 + timedelta(days=7)
    status = step(cluster, week)
    assert status["phase"] == "Queued" and "startTime" not in status  # a week in the queue: not failed
    cluster.admit()
    status = step(cluster, week)
    assert status["phase"] != "Failed" and status["startTime"] == "2026-11-29T12:00:00Z"
    status = step(cluster, week + timedelta(seconds=601))
    assert status["phase"] == "Failed" and condition(status, "Failed")["reason"] == "DeadlineExceeded"
    assert "created, admitted or resumed (2026-11-29T12:00:00Z)" in condition(status, "Failed")["message"]


def test_a_child_whose_deleted_event_fell_in_a_relist_gap_is_found_by_the_relist_check_and_re_created():
    cluster = FakeCluster()
    watch = worker_2_lost_in_a_relist_gap(cluster)
    # The index as kopf keeps it: every watched kind's entries by job, the ghost included.
    indexes = {kind: {(NS, "j"): watch(NS, "j", kind)} for kind in WATCHED_KINDS}
    context = handlers.Context(client=cluster, defaults=DEFAULTS, clock=lambda: T0)
    context.observed = handlers.indexed(indexes, lambda: context.ghosts)
    handlers.reconcile_job(context, NS, "j")
    assert "j-worker-2" not in cluster.pods()  # the ghost holds the worker's place: nothing is re-created
    assert handlers.find_ghosts(context, indexes) == {(NS, "j")}
    handlers.reconcile_job(context, NS, "j")
    assert "j-worker-2" in cluster.pods()
    ghost = next(c for c in indexes[("v1", "Pod")][(NS, "j")] if c["metadata"]["name"] == "j-worker-2")
    assert ghost["metadata"]["uid"] in context.ghosts  # kept out for good; the new pod has another uid
    assert handlers.find_ghosts(context, indexes) == set()  # known: its job is not reconciled for it again


# ---- 4. a resize under Kueue ----


def test_a_resize_under_kueue_creates_no_pod_of_the_new_size_while_the_old_workload_exists():
    cluster = FakeCluster(kueue=True)
    elastic = {"minNodes": 1, "maxNodes": 4}
    admitted(cluster, queued_job(elastic=elastic))
    cluster.apply_job(queued_job(nodes=3, elastic=elastic))
    mark = len(cluster.writes)
    status = step(cluster, T0)
    assert status["restarts"] == 0 and cluster.workload("j")["metadata"]["deletionTimestamp"]
    assert [w for w in cluster.writes[mark:] if w[0] == "create"] == []  # the old group still holds the name
    cluster.kueue_sync()  # Kueue stops and lets go every pod of the old group, then drops its Workload
    assert cluster.workload("j") is None
    step(cluster, T0 + timedelta(seconds=1))  # old pods still Terminating: their names are held, not their group
    cluster.kubelet_confirms()
    step(cluster, T0 + timedelta(seconds=2))
    cluster.kueue_sync()
    cluster.admit()
    counts = {name: pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"]
              for name, pod in cluster.pods().items()}
    assert counts == {"j-worker-0": "3", "j-worker-1": "3", "j-worker-2": "3"}
    assert not any(p["spec"]["schedulingGates"] for p in cluster.pods().values())
    # No pod was ever deleted by Kueue before it ran, and nothing was reported as failed.
    assert not [e for _, e in cluster.events if e.reason in ("WorkerFailed", "WorkerExited")]


def test_a_created_pod_deleted_before_any_pass_saw_it_is_created_again_at_once_on_its_deleted_event():
    cluster = FakeCluster(kueue=True)
    cluster.apply_job(queued_job())
    context = handlers.Context(client=cluster, defaults=DEFAULTS, clock=lambda: T0)
    context.observed = lambda namespace, name, kind: []  # the watch has delivered nothing of them yet
    handlers.reconcile_job(context, NS, "j")
    gone = cluster.pods()["j-worker-1"]
    # Kueue deletes it (gated, unscheduled: gone once finalized) before any pass saw it; its DELETED event comes.
    cluster.delete(ObjectRef("v1", "Pod", NS, "j-worker-1"))
    cluster.remove_finalizer("j-worker-1", "kueue.x-k8s.io/managed")
    assert "j-worker-1" not in cluster.pods()
    handlers.on_pod(labels={JOB_NAME_LABEL: "j"}, namespace=NS, memo=kopf.Memo(context=context), body=gone)
    assert cluster.pods()["j-worker-1"]["metadata"]["uid"] != gone["metadata"]["uid"]  # not 5 minutes later


def kubeflow_worker(cluster, restarts, uid="kf-1"):
    """The training operator's pod for worker 0, its trainer container restarted in place `restarts` times."""
    cluster.put({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "j-worker-0", "namespace": NS, "uid": uid,
        "labels": {JOB_NAME_LABEL: "j", "training.kubeflow.org/job-name": "j"}},
        "spec": {"containers": [{"name": "pytorch", "image": "img:1"}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "pytorch", "restartCount": restarts}]}})


def test_pytorchjob_container_restarts_in_place_are_counted_once_each():
    cluster = FakeCluster()
    cluster.apply_job(manifest(backend="pytorchjob"))
    step(cluster)
    kubeflow_worker(cluster, 0)
    assert step(cluster)["restarts"] == 0
    kubeflow_worker(cluster, 2)  # OnFailure: the kubelet restarted the trainer twice in its pod
    status = step(cluster)
    assert status["restarts"] == 2 and status["containerRestarts"] == 2
    assert step(cluster)["restarts"] == 2  # read again: not counted twice
    kubeflow_worker(cluster, 0, uid="kf-2")  # the pod replaced: its count starts again
    assert step(cluster)["restarts"] == 2
    kubeflow_worker(cluster, 1, uid="kf-2")
    assert step(cluster)["restarts"] == 3
