"""Why a job is not running: the scheduler's and the kubelet's reasons reach the WorkersReady condition, the phase's
condition, `status.reason` and one Warning event per change, and go once the pods run (waiting.py)."""

from datetime import timedelta

import pytest
from fake_cluster import FakeCluster
from test_reconcile import NS, T0, condition, manifest, started, step

from brain_operator.cluster.children import observed_child
from brain_operator.status.waiting import CONTAINER_CREATING_SECONDS, TERMINATING_MARGIN_SECONDS, pod_waiting

IMAGE = "registry.example/brain-trainer:1"
FIT_ERROR = "0/8 nodes are available: 8 Insufficient nvidia.com/gpu."


def warnings(cluster):
    return [(e.reason, e.message) for _, e in cluster.events if e.type == "Warning"]


# (what the cluster does to both pods, the reason, words the message must carry)
CASES = {
    "unschedulable": (lambda c, pod: c.unschedulable(pod, FIT_ERROR), "Unschedulable", FIT_ERROR),
    "image pull back-off": (lambda c, pod: c.pull_fails(pod, backoff=True), "ImagePullBackOff",
                            f'Back-off pulling image "{IMAGE}"'),
    "image pull error": (lambda c, pod: c.pull_fails(pod, backoff=False), "ErrImagePull", f'image "{IMAGE}": rpc error'),
    "missing secret": (lambda c, pod: c.config_missing(pod, "secret", "hf-token"), "CreateContainerConfigError",
                       'secret "hf-token" not found'),
    "missing configmap": (lambda c, pod: c.config_missing(pod, "configmap", "extra"), "CreateContainerConfigError",
                          'configmap "extra" not found'),
}


@pytest.mark.parametrize("case", CASES)
def test_a_waiting_reason_reaches_the_condition_the_event_and_the_status_then_clears(case):
    do, reason, words = CASES[case]
    cluster = FakeCluster()
    cluster.apply_job(manifest())
    assert condition(step(cluster), "Pending")["reason"] == "WaitingForWorkers"
    for pod in ("j-worker-0", "j-worker-1"):
        do(cluster, pod)
    status = step(cluster, T0 + timedelta(seconds=5))
    ready, pending = condition(status, "WorkersReady"), condition(status, "Pending")
    assert ready["status"] == "False" and ready["reason"] == reason and status["reason"] == reason
    assert ready["message"] == f"worker pods j-worker-0, j-worker-1: {words}" or (
        ready["message"].startswith("worker pods j-worker-0, j-worker-1: ") and words in ready["message"])
    assert (pending["status"], pending["reason"], pending["message"]) == ("True", reason, ready["message"])
    assert status["phase"] == "Pending" and warnings(cluster) == [(reason, ready["message"])]
    # Still waiting the same way: nothing new to say, nothing written.
    assert step(cluster, T0 + timedelta(seconds=60)) == status and len(warnings(cluster)) == 1
    cluster.run_all()
    status = step(cluster, T0 + timedelta(seconds=90))
    assert status["phase"] == "Running" and "reason" not in status
    assert condition(status, "WorkersReady")["status"] == "True"
    assert [(e.type, e.reason) for _, e in cluster.events][-2:] == [("Normal", "WorkersReady"), ("Normal", "Running")]


def test_the_phase_event_of_a_pending_job_says_why():
    cluster = FakeCluster()
    cluster.apply_job(manifest(nodes=1))
    step(cluster)
    assert [e.message for _, e in cluster.events] == ["phase None -> Pending: 0/1 workers running"]


def test_a_new_reason_is_a_new_event_and_only_its_pods_are_named():
    cluster = FakeCluster()
    cluster.apply_job(manifest(nodes=3))
    step(cluster)
    cluster.unschedulable("j-worker-2", FIT_ERROR)
    step(cluster)
    # A broken secret is more decisive than capacity: it names its own pod.
    cluster.config_missing("j-worker-0", "secret", "hf-token")
    status = step(cluster)
    assert condition(status, "WorkersReady")["message"] == 'worker pod j-worker-0: secret "hf-token" not found'
    assert [r for r, _ in warnings(cluster)] == ["Unschedulable", "CreateContainerConfigError"]
    cluster.run_all()
    cluster.unschedulable("j-worker-2", FIT_ERROR)
    status = step(cluster)
    assert status["reason"] == "Unschedulable" and warnings(cluster)[-1] == ("Unschedulable", f"worker pod j-worker-2: {FIT_ERROR}")


def test_a_volume_that_does_not_mount_is_named_after_a_while():
    cluster = FakeCluster()
    cluster.apply_job(manifest(nodes=1))
    step(cluster)
    cluster.creating("j-worker-0", node="gpu-3")
    # An ordinary start: ContainerCreating says nothing yet.
    status = step(cluster, T0 + timedelta(seconds=CONTAINER_CREATING_SECONDS - 1))
    assert condition(status, "WorkersReady")["reason"] == "WaitingForWorkers" and warnings(cluster) == []
    status = step(cluster, T0 + timedelta(seconds=CONTAINER_CREATING_SECONDS))
    message = condition(status, "WorkersReady")["message"]
    assert status["reason"] == "ContainerCreating" and "node gpu-3" in message and "FailedMount" in message
    assert "kubectl describe pod j-worker-0" in message and len(warnings(cluster)) == 1


def test_a_pod_terminating_past_its_grace_on_a_lost_node_is_named_with_its_node():
    cluster = FakeCluster()
    started(cluster)
    cluster.place("j-worker-1", "gpu-7")
    cluster.lose_node("gpu-7")
    grace_end = cluster.pods()["j-worker-1"]["metadata"]["deletionTimestamp"]
    # Within its grace (and the margin) a Terminating pod is only leaving.
    status = step(cluster, T0 + timedelta(seconds=300 + TERMINATING_MARGIN_SECONDS - 1))
    assert condition(status, "WorkersReady")["reason"] == "WaitingForWorkers"
    status = step(cluster, T0 + timedelta(seconds=300 + TERMINATING_MARGIN_SECONDS))
    ready = condition(status, "WorkersReady")
    assert ready["reason"] == status["reason"] == "StuckTerminating"
    assert ready["message"].startswith(f"worker pod j-worker-1: Terminating on node gpu-7 past its grace period, "
                                       f"which ended {grace_end}")
    assert "kubectl delete pod j-worker-1 --force" in ready["message"]
    assert condition(status, status["phase"])["reason"] == "StuckTerminating"
    # Later passes add no event: the message holds times, not a growing duration.
    step(cluster, T0 + timedelta(hours=1))
    assert [r for r, _ in warnings(cluster)].count("StuckTerminating") == 1


def test_what_the_watch_keeps_of_a_waiting_pod_says_the_same():
    cluster = FakeCluster()
    cluster.apply_job(manifest(nodes=2))
    step(cluster)
    cluster.pull_fails("j-worker-0", backoff=True)
    cluster.unschedulable("j-worker-1", FIT_ERROR)
    later = T0 + timedelta(seconds=1)
    for pod in cluster.pods(NS).values():
        assert pod_waiting(observed_child(pod), later) == pod_waiting(pod, later) is not None


def test_a_pod_gated_by_kueue_is_queued_not_unschedulable():
    cluster = FakeCluster(kueue=True)
    cluster.apply_job(manifest(nodes=1, scheduling={"queueName": "q"}))
    step(cluster)
    status = step(cluster)
    assert status["phase"] == "Queued" and condition(status, "WorkersReady")["reason"] == "WaitingForWorkers"


def test_the_deadline_counts_from_creation_and_fires_while_every_pod_is_pending():
    cluster = FakeCluster()
    cluster.apply_job(manifest(runPolicy={"activeDeadlineSeconds": 600}))
    step(cluster)
    for pod in ("j-worker-0", "j-worker-1"):
        cluster.unschedulable(pod, FIT_ERROR)
    status = step(cluster, T0 + timedelta(seconds=599))
    assert status["phase"] == "Pending" and status["startTime"] == "2026-11-22T12:00:00Z"
    status = step(cluster, T0 + timedelta(seconds=600))
    failed = condition(status, "Failed")
    assert status["phase"] == "Failed" and failed["reason"] == "DeadlineExceeded"
    assert "activeDeadlineSeconds=600" in failed["message"] and cluster.pods() == {}


def test_the_deadline_counts_from_creation_even_when_the_operator_sees_the_job_late():
    cluster = FakeCluster()
    cluster.apply_job(manifest(runPolicy={"activeDeadlineSeconds": 600}))
    status = step(cluster, T0 + timedelta(seconds=601))
    assert status["phase"] == "Failed" and condition(status, "Failed")["reason"] == "DeadlineExceeded"
    assert cluster.pods() == {}


def test_a_suspended_span_does_not_count_against_the_deadline():
    cluster = FakeCluster()
    job = manifest(runPolicy={"activeDeadlineSeconds": 600, "suspend": True})
    cluster.apply_job(job)
    assert step(cluster)["phase"] == "Suspended"
    job["spec"]["runPolicy"]["suspend"] = False
    cluster.apply_job(job)
    resumed = T0 + timedelta(hours=2)
    status = step(cluster, resumed)
    assert status["phase"] == "Pending" and status["startTime"] == "2026-11-22T14:00:00Z"
    assert step(cluster, resumed + timedelta(seconds=599))["phase"] == "Pending"
    assert step(cluster, resumed + timedelta(seconds=600))["phase"] == "Failed"


def kubeflow_pod(cluster, role, index):
    """A pod as the training operator makes it from the PyTorchJob: the template's labels (ours) and its own
    (kubeflow/common constants.go; kubeflow-training's constants)."""
    from kubeflow.training.constants import constants as kubeflow

    pytorchjob = next(o for r, o in cluster.objects.items() if r.kind == "PyTorchJob")
    template = pytorchjob["spec"]["pytorchReplicaSpecs"][role]["template"]
    name = f"{pytorchjob['metadata']['name']}-{role.lower()}-{index}"
    labels = {**template["metadata"]["labels"], kubeflow.JOB_NAME_LABEL: pytorchjob["metadata"]["name"],
              kubeflow.REPLICA_TYPE_LABEL: role.lower(), kubeflow.REPLICA_INDEX_LABEL: str(index)}
    cluster.put({"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "labels": labels,
                              "creationTimestamp": "2026-11-22T12:00:00Z"},
                 "spec": template["spec"], "status": {"phase": "Pending"}})
    return name


@pytest.mark.parametrize("case", ["unschedulable", "image pull back-off", "missing secret"])
def test_the_pods_kubeflow_makes_for_a_pytorchjob_say_why_it_waits(case):
    do, reason, words = CASES[case]
    cluster = FakeCluster()
    cluster.apply_job(manifest(backend="pytorchjob"))
    assert step(cluster)["phase"] == "Pending"
    pods = [kubeflow_pod(cluster, "Master", 0), kubeflow_pod(cluster, "Worker", 0)]
    for pod in pods:
        do(cluster, pod)
    status = step(cluster, T0 + timedelta(seconds=5))
    ready, pending = condition(status, "WorkersReady"), condition(status, "Pending")
    assert ready["status"] == "False" and ready["reason"] == reason and status["reason"] == reason
    assert ready["message"].startswith(f"worker pods {', '.join(sorted(pods))}: ") and words in ready["message"]
    assert (pending["status"], pending["reason"], pending["message"]) == ("True", reason, ready["message"])
    assert warnings(cluster) == [(reason, ready["message"])]
    assert step(cluster, T0 + timedelta(seconds=60)) == status and len(warnings(cluster)) == 1
    # Kubeflow runs them: the wait is over, and so is its reason.
    for pod in pods:
        cluster.set_pod(pod, "Running", ready=True)
    ref = next(r for r in cluster.objects if r.kind == "PyTorchJob")
    cluster.objects[ref]["status"] = {
        "conditions": [{"type": "Running", "status": "True", "reason": "PyTorchJobRunning",
                        "lastTransitionTime": "2026-11-22T12:01:00Z"}],
        "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 1}},
    }
    status = step(cluster, T0 + timedelta(seconds=90))
    assert status["phase"] == "Running" and "reason" not in status
    assert condition(status, "WorkersReady")["status"] == "True"


def test_a_pod_of_another_pytorchjob_is_not_this_jobs_wait():
    cluster = FakeCluster()
    cluster.apply_job(manifest(backend="pytorchjob"))
    step(cluster)
    pod = kubeflow_pod(cluster, "Worker", 0)
    cluster.objects[next(r for r in cluster.objects if r.name == pod)]["metadata"]["labels"][
        "training.kubeflow.org/job-name"] = "someone-else"
    cluster.unschedulable(pod, FIT_ERROR)
    status = step(cluster, T0 + timedelta(seconds=5))
    assert "reason" not in status and condition(status, "Pending")["reason"] == "PyTorchJobPending"
