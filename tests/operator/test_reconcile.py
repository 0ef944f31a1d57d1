"""reconcile.py against the in-memory ClusterClient: issue 4's acceptance point 4, both backends."""

from datetime import datetime, timedelta, timezone

import jsonschema
import pytest
from fake_cluster import FakeCluster

from brain_operator.crd import status_schema
from brain_operator.reconcile import reconcile
from brain_operator.spec import API_VERSION, KIND
from brain_operator.status.compute import format_time
from brain_trainer import contract
from brain_trainer.contract import PREEMPTED

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)
NS = "default"


def manifest(name="j", nodes=2, **spec):
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": {"image": "registry.example/brain-trainer:1", "nodes": nodes, **spec},
    }


STATUS_SCHEMA = jsonschema.Draft4Validator(status_schema())


def step(cluster, now=T0, name="j"):
    status = reconcile(cluster.get_job(NS, name), cluster, now)
    # Every status written fits the CRD, and the API server would prune no key of it.
    STATUS_SCHEMA.validate(status)
    declared = STATUS_SCHEMA.schema["properties"]
    for key, value in status.items():
        assert key in declared and (not isinstance(value, dict) or set(value) <= set(declared[key]["properties"])), key
    assert cluster.get_job(NS, name)["status"] == status
    return status


def condition(status, kind):
    return next(c for c in status["conditions"] if c["type"] == kind)


def started(cluster, job=None, **spec):
    """A job whose pods exist and run."""
    cluster.apply_job(job or manifest(**spec))
    step(cluster)
    cluster.run_all()
    status = step(cluster)
    assert status["phase"] == "Running"
    return status


@pytest.fixture
def cluster():
    return FakeCluster()


def test_create_renders_children_and_a_pending_status(cluster):
    cluster.apply_job(manifest(nodes=3))
    status = step(cluster)
    assert cluster.kinds() == ["ConfigMap", "NetworkPolicy", "Pod", "Pod", "Pod", "Service"]
    assert list(cluster.pods()) == ["j-worker-0", "j-worker-1", "j-worker-2"]
    owner = cluster.pods()["j-worker-0"]["metadata"]["ownerReferences"][0]
    assert owner["uid"] == cluster.get_job(NS, "j")["metadata"]["uid"]
    assert status["phase"] == "Pending" and status["observedGeneration"] == 1 and status["restarts"] == 0
    assert condition(status, "Valid")["status"] == "True"
    assert status["workers"] == {"desired": 3, "ready": 0, "running": 0, "succeeded": 0, "failed": 0}
    assert cluster.get_job(NS, "j")["status"] == status


def test_repeat_and_resume_write_nothing(cluster):
    cluster.apply_job(manifest())
    first = step(cluster)
    writes = len(cluster.writes)
    # Again, and as a restarted operator would, later: the same cluster, the same answer, no write.
    assert step(cluster) == first and step(cluster, T0 + timedelta(hours=1)) == first
    assert len(cluster.writes) == writes
    cluster.run_all()
    running = step(cluster)
    assert [kind for kind, _ in cluster.writes[writes:]] == ["patch_status"]
    writes = len(cluster.writes)
    assert step(cluster, T0 + timedelta(minutes=3)) == running and len(cluster.writes) == writes
    assert len(cluster.pods()) == 2


def test_failed_pod_is_recreated_and_restarts_grow(cluster):
    started(cluster)
    cluster.exit_pod("j-worker-1", 1, message="Traceback: CUDA error")
    before = len(cluster.events)
    status = step(cluster)
    assert status["restarts"] == 1 and status["phase"] == "Restarting"
    # Told once on the job: the failure with its exit code, and the phase change.
    (_, failure), (_, phase) = cluster.events[before:]
    assert failure.reason == "WorkerFailed" and "j-worker-1" in failure.message and "exit code 1" in failure.message
    assert (phase.type, phase.reason) == ("Warning", "Restarting")
    step(cluster)
    assert len(cluster.events) == before + 2
    assert cluster.pods()["j-worker-1"]["status"]["phase"] == "Pending"  # a fresh pod
    cluster.run_all()
    status = step(cluster)
    assert status["phase"] == "Running" and status["restarts"] == 1
    assert condition(status, "Restarting")["status"] == "False"


@pytest.mark.parametrize(
    "disrupt",
    [
        lambda c: c.evict_pod("j-worker-0"),
        lambda c: c.exit_pod("j-worker-0", PREEMPTED),
        lambda c: c.set_pod("j-worker-0", "Failed", conditions=[{"type": "DisruptionTarget", "status": "True"}]),
    ],
    ids=["evicted", "preempted-exit-code", "disruption-target"],
)
def test_evicted_or_preempted_pods_are_replaced_for_free(cluster, disrupt):
    started(cluster, runPolicy={"backoffLimit": 0})
    disrupt(cluster)
    status = step(cluster)
    assert status["restarts"] == 0 and status["phase"] == "Restarting"
    assert cluster.pods()["j-worker-0"]["status"]["phase"] == "Pending"


def test_spent_budget_fails_the_job_for_good(cluster):
    started(cluster, runPolicy={"backoffLimit": 1})
    cluster.exit_pod("j-worker-0", 1)
    assert step(cluster)["restarts"] == 1
    cluster.run_all()
    step(cluster)
    cluster.exit_pod("j-worker-1", 137)
    status = step(cluster)
    assert status["phase"] == "Failed" and status["restarts"] == 1
    failed = condition(status, "Failed")
    assert failed["reason"] == "BackoffLimitExceeded" and "j-worker-1" in failed["message"]
    assert "backoffLimit=1" in failed["message"] and status["completionTime"] == format_time(T0)
    # The failed pod stays for its logs; its still-running sibling is stopped.
    assert list(cluster.pods()) == ["j-worker-1"]
    # Nothing brings it back: not pods running again, not missing children, not time.
    cluster.objects = {r: o for r, o in cluster.objects.items() if r.kind != "Service"}
    writes = len(cluster.writes)
    later = step(cluster, T0 + timedelta(hours=2))
    assert later["phase"] == "Failed" and later["conditions"] == status["conditions"]
    assert len(cluster.writes) == writes and "Service" not in cluster.kinds()


def test_all_workers_succeeded(cluster):
    started(cluster, runPolicy={"ttlSecondsAfterFinished": 60})
    cluster.exit_pod("j-worker-0", 0)
    status = step(cluster, T0 + timedelta(minutes=1))
    assert status["phase"] == "Running" and status["workers"]["succeeded"] == 1
    cluster.exit_pod("j-worker-1", 0)
    done = step(cluster, T0 + timedelta(minutes=2))
    assert done["phase"] == "Succeeded" and done["completionTime"] == format_time(T0 + timedelta(minutes=2))
    assert condition(done, "Succeeded")["status"] == "True" and done["workers"]["succeeded"] == 2
    assert len(cluster.pods()) == 2
    # ttlSecondsAfterFinished: the pods go, the job and its status stay.
    after = step(cluster, T0 + timedelta(minutes=3, seconds=1))
    assert cluster.pods() == {} and after["phase"] == "Succeeded"
    assert after["completionTime"] == done["completionTime"]


def test_workers_that_fail_after_training_ended_fail_the_job(cluster):
    started(cluster)
    cluster.exit_pod("j-worker-0", 0)
    cluster.exit_pod("j-worker-1", 1)
    status = step(cluster)
    assert status["phase"] == "Failed" and condition(status, "Failed")["reason"] == "WorkersFailed"
    assert len(cluster.pods()) == 2  # nothing recreated once training is over


def test_deleted_children_come_back(cluster):
    started(cluster)
    for ref in [r for r in cluster.objects if r.kind in ("Service", "ConfigMap", "NetworkPolicy") or r.name == "j-worker-1"]:
        del cluster.objects[ref]
    status = step(cluster)
    assert cluster.kinds() == ["ConfigMap", "NetworkPolicy", "Pod", "Pod", "Service"]
    # A pod the user deleted is not a failure.
    assert status["restarts"] == 0


def test_invalid_spec_fails_without_children(cluster):
    cluster.apply_job(manifest(nodes=0, training={"microBatchSize": "eight"}))
    status = step(cluster)
    assert status["phase"] == "Failed" and cluster.kinds() == []
    valid = condition(status, "Valid")
    assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
    assert "spec.nodes: must be >= 1, got 0" in valid["message"]
    assert "spec.training.microBatchSize" in valid["message"]
    assert condition(status, "Failed")["reason"] == "InvalidSpec"
    assert step(cluster) == status
    # A corrected spec runs: an invalid spec is the one failure that is not final.
    cluster.apply_job(manifest(nodes=1))
    fixed = step(cluster)
    assert fixed["phase"] == "Pending" and condition(fixed, "Valid")["status"] == "True"
    assert fixed["observedGeneration"] == 2 and len(cluster.pods()) == 1


def test_suspend_deletes_pods_and_resume_brings_them_back(cluster):
    started(cluster)
    cluster.exit_pod("j-worker-1", 1)
    step(cluster)
    cluster.apply_job(manifest(runPolicy={"suspend": True}))
    status = step(cluster, T0 + timedelta(minutes=1))
    assert status["phase"] == "Suspended" and cluster.pods() == {}
    assert cluster.kinds() == ["ConfigMap", "NetworkPolicy", "Service"] and status["restarts"] == 1
    assert step(cluster, T0 + timedelta(minutes=2)) == status
    cluster.apply_job(manifest(runPolicy={"suspend": False}))
    resumed = step(cluster, T0 + timedelta(minutes=3))
    assert resumed["phase"] == "Pending" and len(cluster.pods()) == 2
    assert condition(resumed, "Suspended")["status"] == "False" and resumed["restarts"] == 1
    cluster.run_all()
    assert step(cluster, T0 + timedelta(minutes=4))["startTime"] == format_time(T0 + timedelta(minutes=3))


def test_nodes_changed_within_the_elastic_range(cluster):
    elastic = {"minNodes": 1, "maxNodes": 4}
    started(cluster, elastic=elastic)
    cluster.apply_job(manifest(nodes=4, elastic=elastic))
    status = step(cluster)
    assert list(cluster.pods()) == [f"j-worker-{i}" for i in range(4)]
    assert status["workers"]["desired"] == 4 and status["phase"] == "Running"  # 2 running >= minNodes 1
    cluster.run_all()
    cluster.apply_job(manifest(nodes=1, elastic=elastic))
    status = step(cluster)
    assert list(cluster.pods()) == ["j-worker-0"] and status["restarts"] == 0
    assert status["workers"]["desired"] == 1 and status["observedGeneration"] == 3
    # Outside the range: refused with the field named, and nothing is touched.
    cluster.apply_job(manifest(nodes=9, elastic=elastic))
    status = step(cluster)
    assert "spec.nodes" in condition(status, "Valid")["message"] and list(cluster.pods()) == ["j-worker-0"]


def test_active_deadline_fails_the_job(cluster):
    started(cluster, runPolicy={"activeDeadlineSeconds": 600})
    assert step(cluster, T0 + timedelta(seconds=599))["phase"] == "Running"
    status = step(cluster, T0 + timedelta(seconds=600))
    assert status["phase"] == "Failed" and condition(status, "Failed")["reason"] == "DeadlineExceeded"
    assert cluster.pods() == {}


def test_a_terminating_pod_is_counted_once_and_replaced_when_gone():
    cluster = FakeCluster()
    started(cluster)
    # Another controller's finalizer keeps the failed pod after its delete (as Kueue's does).
    ref = next(r for r in cluster.objects if r.name == "j-worker-0")
    cluster.objects[ref]["metadata"]["finalizers"] = ["example.com/hold"]
    cluster.exit_pod("j-worker-0", 1)
    assert step(cluster)["restarts"] == 1
    # The old pod still terminates: the create met 409 on a Terminating pod, planned again, and waits for it.
    assert cluster.pods()["j-worker-0"]["metadata"]["deletionTimestamp"]
    assert ("already_exists", ref) in cluster.writes
    assert step(cluster)["restarts"] == 1
    cluster.remove_finalizer("j-worker-0", "example.com/hold")
    assert "j-worker-0" not in cluster.pods()
    status = step(cluster)
    assert status["restarts"] == 1 and cluster.pods()["j-worker-0"]["status"]["phase"] == "Pending"


def test_pytorchjob_backend(cluster):
    cluster.apply_job(manifest(nodes=3, backend="pytorchjob"))
    status = step(cluster)
    assert "PyTorchJob" in cluster.kinds() and "Pod" not in cluster.kinds()
    assert status["phase"] == "Pending" and step(cluster) == status
    ref = next(r for r in cluster.objects if r.kind == "PyTorchJob")
    cluster.objects[ref]["status"] = {
        "conditions": [
            {"type": "Created", "status": "True", "lastTransitionTime": "2026-11-22T12:00:00Z"},
            {"type": "Running", "status": "True", "reason": "PyTorchJobRunning",
             "lastTransitionTime": "2026-11-22T12:00:10Z"},
        ],
        "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 2}},
    }
    status = step(cluster)
    assert status["phase"] == "Running" and status["workers"]["running"] == 3
    # Suspending a delegated job patches the PyTorchJob; Kubeflow does the rest.
    cluster.apply_job(manifest(nodes=3, backend="pytorchjob", runPolicy={"suspend": True}))
    writes = len(cluster.writes)
    step(cluster)
    assert ("patch", ref) in cluster.writes[writes:]
    assert cluster.objects[ref]["spec"]["runPolicy"]["suspend"] is True
    writes = len(cluster.writes)
    step(cluster)
    assert ("patch", ref) not in cluster.writes[writes:]
    cluster.objects[ref]["status"]["conditions"].append(
        {"type": "Succeeded", "status": "True", "lastTransitionTime": "2026-11-22T13:00:00Z"}
    )
    cluster.objects[ref]["status"]["completionTime"] = "2026-11-22T13:00:00Z"
    done = step(cluster)
    assert done["phase"] == "Succeeded" and done["completionTime"] == "2026-11-22T13:00:00Z"


def test_pytorchjob_size_changes_are_patched(cluster):
    elastic = {"minNodes": 1, "maxNodes": 4}
    cluster.apply_job(manifest(nodes=2, backend="pytorchjob", elastic=elastic))
    step(cluster)
    ref = next(r for r in cluster.objects if r.kind == "PyTorchJob")
    cluster.apply_job(manifest(nodes=3, backend="pytorchjob", elastic=elastic))
    step(cluster)
    assert cluster.objects[ref]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    # A fixed-size job growing from one node gains a whole Worker role.
    cluster.apply_job(manifest(name="solo", nodes=1, backend="pytorchjob"))
    step(cluster, name="solo")
    solo = next(r for r in cluster.objects if r.kind == "PyTorchJob" and r.name == "solo")
    assert set(cluster.objects[solo]["spec"]["pytorchReplicaSpecs"]) == {"Master"}
    cluster.apply_job(manifest(name="solo", nodes=2, backend="pytorchjob"))
    step(cluster, name="solo")
    workers = cluster.objects[solo]["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert workers["replicas"] == 1 and workers["template"]["spec"]["containers"]


# -- runPolicy.failurePolicy: the trainer's reason decides Restart, RestartNotCounted or FailJob --

DEFAULT_ACTIONS = {
    "storage-full": "FailJob",
    "config-error": "FailJob",
    "data-error": "FailJob",
    "out-of-memory": "Restart",
    "collective-timeout": "Restart",
    "stalled": "Restart",
    "error": "Restart",
    "preempted": "RestartNotCounted",
}


def fail_worker(cluster, reason, line, pod="j-worker-1"):
    code = contract.EXIT_CODES[reason]
    cluster.exit_pod(pod, code, message=contract.termination_message(reason, line))


def failure_event(cluster, before):
    (found,) = [e for _, e in cluster.events[before:] if e.reason == "WorkerFailed"]
    return found.message


@pytest.mark.parametrize("reason", sorted(DEFAULT_ACTIONS))
def test_each_reason_takes_its_default_action_and_is_told_everywhere(cluster, reason):
    started(cluster, runPolicy={"backoffLimit": 3})
    before = len(cluster.events)
    fail_worker(cluster, reason, f"what the trainer said about {reason}")
    status = step(cluster)
    action = DEFAULT_ACTIONS[reason]
    camel_reason = "".join(part.capitalize() for part in reason.split("-"))
    told = f"j-worker-1: {reason}: what the trainer said about {reason}"
    assert status["reason"] == reason
    if action == "FailJob":
        assert status["phase"] == "Failed" and status["restarts"] == 0
        failed = condition(status, "Failed")
        assert failed["reason"] == camel_reason and told in failed["message"]
        assert f"runPolicy.failurePolicy.{camel_reason[0].lower() + camel_reason[1:]}: FailJob" in failed["message"]
        assert cluster.pods()["j-worker-1"]["status"]["phase"] == "Failed"  # kept for its logs, not replaced
    else:
        assert status["phase"] == "Restarting"
        assert status["restarts"] == (1 if action == "Restart" else 0)
        restarting = condition(status, "Restarting")
        assert restarting["reason"] == camel_reason and told in restarting["message"]
        assert cluster.pods()["j-worker-1"]["status"]["phase"] == "Pending"  # a fresh pod
    event = failure_event(cluster, before)
    assert f"{reason}: what the trainer said about {reason}" in event and f": {action})" in event


def test_a_failure_policy_overrides_the_defaults(cluster):
    policy = {"storageFull": "Restart", "error": "FailJob", "collectiveTimeout": "RestartNotCounted"}
    started(cluster, runPolicy={"backoffLimit": 1, "failurePolicy": policy})
    fail_worker(cluster, "storage-full", "the claim was grown meanwhile")
    status = step(cluster)
    assert (status["phase"], status["restarts"]) == ("Restarting", 1)
    cluster.run_all()
    step(cluster)
    fail_worker(cluster, "collective-timeout", "peer vanished", pod="j-worker-0")
    status = step(cluster)
    assert (status["phase"], status["restarts"]) == ("Restarting", 1)  # not counted: the budget of 1 holds
    cluster.run_all()
    step(cluster)
    fail_worker(cluster, "error", "ValueError: bad", pod="j-worker-0")
    status = step(cluster)
    assert status["phase"] == "Failed" and condition(status, "Failed")["reason"] == "Error"
    assert "runPolicy.failurePolicy.error: FailJob" in condition(status, "Failed")["message"]


def test_the_cause_is_named_not_the_peer_it_took_down(cluster):
    started(cluster)
    fail_worker(cluster, "collective-timeout", "Connection closed by peer", pod="j-worker-0")
    fail_worker(cluster, "out-of-memory", "MemoryError on rank 1", pod="j-worker-1")
    status = step(cluster)
    assert status["reason"] == "out-of-memory" and condition(status, "Restarting")["reason"] == "OutOfMemory"
    # One incident, one count: the peer's broken collective followed the out-of-memory.
    assert status["restarts"] == 1 and status["incident"]["pod"] == "j-worker-1"
    kinds = [(e.type, e.reason) for _, e in cluster.events if e.reason in ("WorkerFailed", "WorkerExited")]
    assert kinds == [("Warning", "WorkerFailed"), ("Normal", "WorkerExited")]


def test_a_spent_budget_names_the_reasons(cluster):
    started(cluster, runPolicy={"backoffLimit": 0})
    fail_worker(cluster, "stalled", "no step for 600 s")
    status = step(cluster)
    failed = condition(status, "Failed")
    assert failed["reason"] == "BackoffLimitExceeded" and "j-worker-1: stalled: no step for 600 s" in failed["message"]
    assert status["reason"] == "stalled"


def test_a_pod_without_a_reason_is_an_error_and_the_kubelets_oom_is_out_of_memory(cluster):
    started(cluster, runPolicy={"backoffLimit": 5})
    cluster.exit_pod("j-worker-0", 1, message="Traceback (most recent call last):\n  ...\nKeyError: 'x'")
    status = step(cluster)
    assert status["reason"] == "error" and "exit code 1: KeyError: 'x'" in condition(status, "Restarting")["message"]
    cluster.run_all()
    step(cluster)
    cluster.set_pod("j-worker-1", "Failed", containerStatuses=[
        {"name": "trainer", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}])
    assert step(cluster)["reason"] == "out-of-memory"


def test_a_bad_failure_policy_is_an_invalid_spec(cluster):
    cluster.apply_job(manifest(runPolicy={"failurePolicy": {"storageFull": "Retry"}}))
    status = step(cluster)
    valid = condition(status, "Valid")
    assert valid["status"] == "False"
    assert ("spec.runPolicy.failurePolicy.storageFull: must be one of Restart, RestartNotCounted, FailJob; got 'Retry'"
            in valid["message"])
