"""failure_policy.py (pure): the reason of a failed pod, the action the policy takes, the cause of a group's failure."""

import dataclasses

import pytest

from brain_operator.status.failure_policy import (ADMISSION_REJECTED, OPERATOR_REASONS, WorkerFailure, explain,
                                                  first_cause, pod_reason, policy_field)
from brain_operator.spec.model import FailurePolicySpec
from brain_trainer import contract


def pod(message=None, *, exit_code=1, reason="Error", pod_reason_=None, conditions=()):
    terminated = {"exitCode": exit_code, "reason": reason, **({"message": message} if message is not None else {})}
    status = {"phase": "Failed", "conditions": list(conditions),
              "containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}]}
    if pod_reason_:
        status["reason"] = pod_reason_
    return {"metadata": {"name": "j-worker-0"}, "status": status}


def test_a_pod_the_kubelet_refused_to_start_is_admission_rejected_with_its_reason_and_free_by_default():
    rejected = {"metadata": {"name": "j-worker-1"}, "status": {
        "phase": "Failed", "reason": "OutOfnvidia.com/gpu",
        "message": "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 8, used: 8, "
                   "capacity: 8"}}
    assert pod_reason(rejected) == (ADMISSION_REJECTED, "OutOfnvidia.com/gpu: Pod was rejected: Node didn't have "
                                    "enough resource: nvidia.com/gpu, requested: 8, used: 8, capacity: 8")
    assert explain(rejected, FailurePolicySpec()).action == "RestartNotCounted"
    assert explain(rejected, FailurePolicySpec(admission_rejected="Restart")).action == "Restart"
    assert policy_field(ADMISSION_REJECTED) == "runPolicy.failurePolicy.admissionRejected"


def test_the_policy_has_one_field_per_contract_reason():
    assert [f.name for f in dataclasses.fields(FailurePolicySpec)] == [
        r.replace("-", "_") for r in (*contract.REASONS, *OPERATOR_REASONS)]
    assert policy_field("collective-timeout") == "runPolicy.failurePolicy.collectiveTimeout"


@pytest.mark.parametrize(
    "the_pod, expected",
    [
        (pod("brain.ai/storage-full: needs 12 MB, 3 MB free"), ("storage-full", "needs 12 MB, 3 MB free")),
        # torchrun's own lines may follow the trainer's message (FallbackToLogsOnError never applies: the file is set)
        (pod("brain.ai/data-error: data.path: no files match 'x'\n"), ("data-error", "data.path: no files match 'x'")),
        (pod("brain.ai/preempted: SIGTERM: step 40 committed", exit_code=1), ("preempted", "SIGTERM: step 40 committed")),
        (pod(None, exit_code=contract.PREEMPTED), ("preempted", "disrupted")),
        (pod("brain.ai/collective-timeout: peer gone", pod_reason_="Evicted"), ("preempted", "Evicted")),
        (pod("brain.ai/out-of-memory: MemoryError", pod_reason_="Evicted"), ("out-of-memory", "MemoryError")),
        (pod(None, exit_code=137, reason="OOMKilled"),
         ("out-of-memory", "the kubelet killed the container at its memory limit (OOMKilled)")),
        (pod("Traceback (most recent call last):\n  File x\nKeyError: 'a'\n"), ("error", "exit code 1: KeyError: 'a'")),
        (pod("brain.ai/unknown-thing: x"), ("error", "exit code 1: brain.ai/unknown-thing: x")),
        (pod(None, conditions=[{"type": "DisruptionTarget", "status": "True"}]), ("preempted", "disrupted")),
    ],
    ids=["named", "named-then-logs", "preempted-message", "preempted-code", "evicted-echo", "evicted-but-oom",
         "kubelet-oom", "log-tail", "unknown-reason", "disruption-target"],
)
def test_pod_reason(the_pod, expected):
    assert pod_reason(the_pod) == expected


@pytest.mark.parametrize("reason, action", [
    ("storage-full", "FailJob"), ("config-error", "FailJob"), ("data-error", "FailJob"),
    ("collective-timeout", "Restart"), ("stalled", "Restart"), ("error", "Restart"), ("out-of-memory", "Restart"),
    ("preempted", "RestartNotCounted"),
])
def test_default_actions(reason, action):
    message = contract.termination_message(reason, "x")
    assert explain(pod(message), FailurePolicySpec()).action == action
    assert explain(pod(message), FailurePolicySpec(**{reason.replace("-", "_"): "FailJob"})).action == "FailJob"


def test_first_cause_prefers_a_primary_reason_then_a_stop_then_a_broken_collective():
    timeout = WorkerFailure("a", "collective-timeout", "", "Restart")
    stop = WorkerFailure("b", "preempted", "", "RestartNotCounted")
    oom = WorkerFailure("c", "out-of-memory", "", "Restart")
    assert first_cause([timeout, stop, oom]) == oom
    assert first_cause([timeout, stop]) == stop
    assert first_cause([timeout]) == timeout and first_cause([]) is None
    assert oom.condition_reason == "OutOfMemory" and timeout.text() == "a: collective-timeout"


def test_termination_messages_are_one_line_and_parse_back():
    text = contract.termination_message("storage-full", "needs\n12 MB  now")
    assert text == "brain.ai/storage-full: needs 12 MB now"
    assert contract.parse_termination(text) == ("storage-full", "needs 12 MB now")
    assert contract.parse_termination(contract.PREEMPTED_MESSAGE) == ("preempted", "")
    assert contract.parse_termination("exit status 1") is None
    assert len(contract.termination_message("error", "x" * 10000)) == contract.TERMINATION_MESSAGE_MAX
    assert len(set(contract.EXIT_CODES.values())) == len(contract.REASONS)  # one code per reason
