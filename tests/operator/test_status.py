"""status.py: phase, conditions, counts and the sticky rules, from pods or a PyTorchJob (pure)."""

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from brain_operator.status.job_status import JobStatus, LastCheckpoint, WorkerCounts
from brain_operator.objects.pods import is_disruption, pod_view
from brain_operator.status.compute import (
    CONDITION_TYPES,
    Failure,
    Observation,
    elastic_status,
    invalid_status,
    pytorchjob_status,
)
from brain_trainer.contract import PREEMPTED, PREEMPTED_MESSAGE, format_time

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)
T1 = T0 + timedelta(minutes=5)


def pod(index, phase="Running", *, ready=True, **status):
    conditions = status.pop("conditions", []) + [{"type": "Ready", "status": "True" if ready else "False"}]
    return {
        "metadata": {"name": f"j-worker-{index}", "labels": {"brain.ai/replica-index": str(index)}},
        "status": {"phase": phase, "conditions": conditions, **status},
    }


def terminated(code, message=""):
    return [{"name": "trainer", "state": {"terminated": {"exitCode": code, "message": message}}}]


def seen(pods, *, desired=2, min_running=2, restarts=0, replaced=0, suspended=False, failure=None, generation=1):
    return Observation(
        generation=generation, desired=desired, min_running=min_running, pods=[pod_view(p) for p in pods],
        restarts=restarts, replaced=replaced, suspended=suspended, failure=failure,
        strategy="ddp", effective_batch_size=16, selector="brain.ai/job-name=j",
    )


def condition(status, kind):
    return next(c for c in status.conditions if c.type == kind)


@pytest.mark.parametrize(
    "status, disrupted",
    [
        ({"phase": "Failed", "reason": "Evicted"}, True),
        ({"phase": "Failed", "reason": "Preempted"}, True),
        ({"phase": "Failed", "conditions": [{"type": "DisruptionTarget", "status": "True"}]}, True),
        ({"phase": "Failed", "containerStatuses": terminated(PREEMPTED)}, True),
        ({"phase": "Failed", "containerStatuses": terminated(143, f"stopped: {PREEMPTED_MESSAGE}")}, True),
        ({"phase": "Failed", "conditions": [{"type": "DisruptionTarget", "status": "False"}]}, False),
        ({"phase": "Failed", "containerStatuses": terminated(1, "Traceback ...")}, False),
        ({"phase": "Failed", "reason": "OOMKilled"}, False),
    ],
)
def test_disruptions_are_told_from_failures(status, disrupted):
    assert is_disruption({"metadata": {"name": "p"}, "status": status}) is disrupted


def test_pod_view_reads_index_readiness_and_termination():
    view = pod_view({**pod(3), "metadata": {"name": "x", "labels": {"brain.ai/replica-index": "3"},
                                            "deletionTimestamp": "2026-11-22T12:00:00Z"}})
    assert (view.index, view.phase, view.ready, view.terminating) == (3, "Running", True, True)
    bare = pod_view({"metadata": {"name": "y"}})
    assert (bare.index, bare.phase, bare.ready, bare.terminating) == (None, "Pending", False, False)


def test_phases_follow_the_pods():
    pending = elastic_status(JobStatus(), seen([pod(0, "Pending", ready=False)]), T0)
    # As a Kubernetes Job's, the start time (the deadline's clock) includes Pending.
    assert pending.phase == "Pending" and pending.start_time == format_time(T0)
    running = elastic_status(pending, seen([pod(0), pod(1, ready=False)]), T1)
    assert running.phase == "Running"
    assert running.workers == WorkerCounts(desired=2, ready=1, running=2, succeeded=0, failed=0)
    assert running.start_time == format_time(T0)
    assert running.nodes == "1/2" and running.selector == "brain.ai/job-name=j"
    assert running.strategy == "ddp" and running.effective_batch_size == 16
    # Losing a worker after running is a restart, not "pending".
    assert elastic_status(running, seen([pod(0)]), T1).phase == "Restarting"
    assert elastic_status(running, seen([pod(0), pod(1)], replaced=1, restarts=1), T1).phase == "Restarting"
    # An elastic job runs once its minimum is there.
    assert elastic_status(pending, seen([pod(0)], min_running=1), T1).phase == "Running"


def test_conditions_keep_their_transition_time_until_they_flip():
    first = elastic_status(JobStatus(), seen([pod(0), pod(1)]), T0)
    assert [c.type for c in first.conditions] == [*CONDITION_TYPES, "WorkersReady"]
    assert condition(first, "Running").status == "True" and condition(first, "Valid").status == "True"
    again = elastic_status(first, seen([pod(0), pod(1)]), T1)
    assert again == first
    restarting = elastic_status(first, seen([pod(0)]), T1)
    assert condition(restarting, "Running") == replace(condition(first, "Running"), status="False",
                                                       reason="Restarting", message="",
                                                       last_transition_time=format_time(T1))
    assert condition(restarting, "Valid") == condition(first, "Valid")


def test_success_sets_completion_time_and_is_sticky():
    running = elastic_status(JobStatus(), seen([pod(0), pod(1)]), T0)
    done = elastic_status(running, seen([pod(0, "Succeeded"), pod(1, "Succeeded")]), T1)
    assert done.phase == "Succeeded" and done.completion_time == format_time(T1)
    assert done.workers.succeeded == 2
    later = elastic_status(done, seen([], failure=Failure("X", "y")), T1 + timedelta(hours=1))
    assert later.phase == "Succeeded" and later.conditions == done.conditions
    assert later.completion_time == done.completion_time and later.workers.succeeded == 0
    edited = invalid_status(done, 2, "spec.nodes: must be >= 1, got 0", T1)
    assert edited == replace(done, observed_generation=2)


def test_failure_is_sticky_and_restarts_never_shrink():
    failed = elastic_status(JobStatus(restarts=3), seen([pod(0, "Failed")], restarts=3,
                                                        failure=Failure("BackoffLimitExceeded", "budget spent")), T0)
    assert failed.phase == "Failed" and condition(failed, "Failed").reason == "BackoffLimitExceeded"
    assert "budget spent" in condition(failed, "Failed").message and failed.completion_time
    revived = elastic_status(failed, seen([pod(0), pod(1)], restarts=0), T1)
    assert revived.phase == "Failed" and revived.restarts == 3


def test_suspension_resets_the_start_time():
    running = elastic_status(JobStatus(), seen([pod(0), pod(1)]), T0)
    suspended = elastic_status(running, seen([], suspended=True), T1)
    assert suspended.phase == "Suspended" and suspended.start_time is None
    assert condition(suspended, "Suspended").status == "True"


def test_progress_fields_survive():
    previous = JobStatus.read({"progress": {"step": 7}, "lastCheckpoint": {"step": 5, "path": "/c/step-00000005"}})
    out = elastic_status(previous, seen([pod(0), pod(1)], generation=4), T0)
    assert out.progress.step == 7 and out.last_checkpoint == LastCheckpoint(5, "/c/step-00000005")
    assert out.observed_generation == 4


def test_invalid_spec_names_the_field():
    out = invalid_status(JobStatus(), 2, "spec.nodes: must be >= 1, got 0", T0)
    assert out.phase == "Failed" and out.observed_generation == 2
    valid = condition(out, "Valid")
    assert valid.status == "False" and valid.reason == "InvalidSpec" and "spec.nodes" in valid.message


def kf(*conditions, replicas=None, **extra):
    return {"status": {"conditions": [{"type": t, "status": s, "reason": f"PyTorchJob{t}", "message": t.lower(),
                                       "lastTransitionTime": when} for t, s, when in conditions],
                       "replicaStatuses": replicas or {}, **extra}}


def kf_status(previous, job, now=T1):
    return pytorchjob_status(previous, job, generation=1, desired=3, strategy="fsdp", effective_batch_size=48,
                             selector="brain.ai/job-name=j", now=now)


@pytest.mark.parametrize(
    "conditions, phase",
    [
        ([], "Pending"),
        ([("Created", "True", "2026-11-22T12:00:00Z")], "Pending"),
        ([("Created", "True", "2026-11-22T12:00:00Z"), ("Running", "True", "2026-11-22T12:01:00Z")], "Running"),
        ([("Running", "False", "2026-11-22T12:01:00Z"), ("Restarting", "True", "2026-11-22T12:02:00Z")], "Restarting"),
        ([("Running", "False", "2026-11-22T12:01:00Z"), ("Succeeded", "True", "2026-11-22T12:03:00Z")], "Succeeded"),
        ([("Running", "True", "2026-11-22T12:01:00Z"), ("Failed", "True", "2026-11-22T12:03:00Z")], "Failed"),
        ([("Suspended", "True", "2026-11-22T12:03:00Z")], "Suspended"),
    ],
)
def test_pytorchjob_conditions_map_onto_phases(conditions, phase):
    out = kf_status(JobStatus(), kf(*conditions))
    assert out.phase == phase
    assert condition(out, phase).status == "True" if phase != "Pending" else out.conditions
    assert out.strategy == "fsdp" and out.effective_batch_size == 48


def test_pytorchjob_status_carries_counts_times_and_restarts():
    assert kf_status(JobStatus(), None).phase == "Pending"
    replicas = {"Master": {"active": 1}, "Worker": {"active": 1, "failed": 1}}
    running = kf_status(JobStatus(), kf(("Running", "True", "2026-11-22T12:01:00Z"), replicas=replicas,
                                        startTime="2026-11-22T12:00:30Z"))
    assert running.workers == WorkerCounts(desired=3, ready=2, running=2, succeeded=0, failed=1)
    assert running.nodes == "2/3"
    assert running.start_time == "2026-11-22T12:00:30Z"
    assert condition(running, "Running").last_transition_time == "2026-11-22T12:01:00Z"
    restart = kf(("Running", "False", "2026-11-22T12:01:00Z"), ("Restarting", "True", "2026-11-22T12:02:00Z"))
    once = kf_status(running, restart)
    assert once.restarts == 1 and kf_status(once, restart).restarts == 1
    back = kf_status(once, kf(("Running", "True", "2026-11-22T12:04:00Z")))
    again = kf(("Running", "False", "2026-11-22T12:04:00Z"), ("Restarting", "True", "2026-11-22T12:05:00Z"))
    assert kf_status(back, again).restarts == 2
    done = kf_status(back, kf(("Succeeded", "True", "2026-11-22T12:09:00Z"), completionTime="2026-11-22T12:09:00Z"))
    assert done.phase == "Succeeded" and done.completion_time == "2026-11-22T12:09:00Z"
    # The PyTorchJob deleted by its own TTL: the finished job stays finished.
    assert kf_status(done, None).phase == "Succeeded"
