"""Events: one per phase transition and per worker failure; none when nothing changed."""

from dataclasses import replace

from brain_operator.status.events import Event, compute_events, pod_exit
from brain_operator.status.job_status import JobStatus
from brain_trainer.contract import PREEMPTED


def failed_pod(name, *, exit_code=None, reason=None, pod_reason=None, message=None):
    terminated = {k: v for k, v in {"exitCode": exit_code, "reason": reason, "message": message}.items() if v is not None}
    status = {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}]}
    if pod_reason:
        status["reason"] = pod_reason
        status["containerStatuses"] = []
    return {"metadata": {"name": name}, "status": status}


RUNNING = JobStatus.read(
    {"phase": "Running", "conditions": [{"type": "Running", "status": "True", "message": "2/2 workers running"}]}
)


def test_nothing_changed_means_no_event():
    assert compute_events(RUNNING, RUNNING, []) == []


def test_phase_transition_is_one_event_with_the_condition_message():
    assert compute_events(JobStatus(phase="Pending"), RUNNING, []) == [
        Event("Normal", "Running", "phase Pending -> Running: 2/2 workers running")
    ]
    failed = JobStatus.read(
        {"phase": "Failed", "conditions": [{"type": "Failed", "status": "True", "message": "backoffLimit 3 spent"}]}
    )
    assert compute_events(RUNNING, failed, [])[0].type == "Warning"


def test_each_worker_failure_names_exit_code_and_reason():
    pods = [
        failed_pod("j-worker-0", exit_code=137, reason="OOMKilled"),
        failed_pod("j-worker-1", exit_code=1, reason="Error", message="CUDA error"),
        failed_pod("j-worker-2", pod_reason="Evicted"),
    ]
    events = compute_events(RUNNING, replace(RUNNING, phase="Restarting"), pods)
    assert [e.message for e in events[:3]] == [
        "worker pod j-worker-0 ended with OOMKilled (exit code 137): out-of-memory: the kubelet killed the container "
        "at its memory limit (OOMKilled); restarted, counted against runPolicy.backoffLimit "
        "(runPolicy.failurePolicy.outOfMemory: Restart)",
        "worker pod j-worker-1 ended with Error (exit code 1): error: exit code 1: CUDA error; restarted, counted "
        "against runPolicy.backoffLimit (runPolicy.failurePolicy.error: Restart)",
        "worker pod j-worker-2 ended with Evicted (no exit code): preempted: Evicted; retried without counting "
        "against runPolicy.backoffLimit (runPolicy.failurePolicy.preempted: RestartNotCounted)",
    ]
    assert all(e.type == "Warning" and e.reason == "WorkerFailed" for e in events[:3])
    assert events[3].reason == "Restarting"


def test_preempted_trainer_is_reported_as_free_retry():
    ended = failed_pod("j-worker-0", exit_code=PREEMPTED, reason="Error")
    assert pod_exit(ended).exit_code == PREEMPTED
    assert "retried without counting" in compute_events(RUNNING, RUNNING, [ended])[0].message
