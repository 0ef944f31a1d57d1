"""Why a worker pod failed, and what the job does about it (pure).

The reason is the trainer's own (`brain.ai/<reason>: <line>` in the
container's termination message, brain_trainer.contract); a pod that names
none is explained by what Kubernetes says (an eviction is a preemption, the
kubelet's OOMKilled is out-of-memory, a pod the kubelet refused to start is
admission-rejected, anything else an error). The action is
`runPolicy.failurePolicy`'s for that reason (docs/operator.md, "When a
worker fails").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import re

from brain_trainer.contract import (
    COLLECTIVE_TIMEOUT,
    ERROR,
    NETWORK_ERROR,
    OUT_OF_MEMORY,
    PREEMPTED_REASON,
    STALLED,
    cause_rank,
    parse_termination,
)

from brain_trainer.schema import camel

from ..objects.pods import disruption_condition, is_disruption, terminated_states
from ..spec.model import FAIL_JOB, RESTART, RESTART_NOT_COUNTED, FailurePolicySpec

# The kubelet's reason for a container killed at its memory limit.
KUBELET_OOM = "OOMKilled"
# A pod the kubelet refused to start: Failed with its admit handler's reason (OutOfnvidia.com/gpu,
# UnexpectedAdmissionError after a reboot before the device plugin registers, NodeAffinity, NodeShutdown) and
# message, and no container ever run (kubernetes pkg/kubelet/kubelet.go rejectPod, from canAdmitPod). The
# operator's own reason, not the trainer's: its action is runPolicy.failurePolicy.admissionRejected.
ADMISSION_REJECTED = "admission-rejected"
OPERATOR_REASONS = (ADMISSION_REJECTED,)
# What a worker reports when a peer, not it, broke the group: a collective that timed out or lost its peer, a
# preflight a rank never joined, the watchdog's stop of a rank left waiting on a dead peer (its message may
# outlive torchrun's restarts in the pod), and torchrun's own rendezvous giving up (below).
CONSEQUENTIAL_REASONS = (COLLECTIVE_TIMEOUT, NETWORK_ERROR, STALLED)
# torchrun's rendezvous errors (torch/distributed/elastic/rendezvous/api.py: RendezvousTimeoutError,
# RendezvousConnectionError, RendezvousClosedError, ...) and the c10d store's (DistNetworkError, DistStoreError),
# as the log tail of a pod whose trainer named no reason shows them.
RENDEZVOUS_ERRORS = re.compile(r"\bRendezvous\w*Error\b|\bDist(?:Network|Store)Error\b")


@dataclass(frozen=True)
class WorkerFailure:
    """One failed worker pod: the reason, its line, and the action the failure policy takes."""

    pod: str
    reason: str  # one of brain_trainer.contract.REASONS or OPERATOR_REASONS
    line: str
    action: str  # Restart, RestartNotCounted or FailJob

    @property
    def condition_reason(self) -> str:
        """The reason as a Kubernetes condition reason spells one: storage-full -> StorageFull."""
        return "".join(part.capitalize() for part in self.reason.split("-"))

    def text(self) -> str:
        return f"{self.pod}: {self.reason}: {self.line}" if self.line else f"{self.pod}: {self.reason}"


def pod_reason(pod: Mapping[str, Any]) -> tuple[str, str]:
    """(reason, line) of a failed worker pod: the trainer's, else what Kubernetes says."""
    ended = terminated_states(pod)
    named = next((r for r in (parse_termination(t.get("message")) for t in ended) if r is not None), None)
    disrupted = is_disruption(pod)
    # A peer's broken collective in a pod that was itself evicted: the eviction is the cause.
    if named is not None and not (disrupted and named[0] == COLLECTIVE_TIMEOUT):
        return named
    if disrupted:
        status = pod.get("status") or {}
        # A pod deleted while still running says why only in its DisruptionTarget condition.
        target = disruption_condition(status) or {}
        why = status.get("reason") or target.get("reason") or "disrupted"
        said = status.get("message") or target.get("message")
        return PREEMPTED_REASON, f"{why}: {said}" if said else why
    status = pod.get("status") or {}
    if status.get("reason") and not ended:
        said = status.get("message")
        return ADMISSION_REJECTED, f"{status['reason']}: {said}" if said else status["reason"]
    if any(t.get("reason") == KUBELET_OOM for t in ended):
        return OUT_OF_MEMORY, "the kubelet killed the container at its memory limit (OOMKilled)"
    code = next((t.get("exitCode") for t in ended), None)
    # With terminationMessagePolicy FallbackToLogsOnError the message is the log's tail: its last line says most.
    tail = [line.strip() for t in ended for line in (t.get("message") or "").splitlines() if line.strip()]
    said = f": {tail[-1]}" if tail else ""
    return ERROR, (f"exit code {code}" if code is not None else "no exit code") + said


def consequential(failure: WorkerFailure) -> bool:
    """Whether the failure is what a worker reports when a peer broke the group (CONSEQUENTIAL_REASONS, a
    rendezvous that gave up), rather than a cause of its own."""
    return failure.reason in CONSEQUENTIAL_REASONS or (failure.reason == ERROR and bool(RENDEZVOUS_ERRORS.search(failure.line)))


def explain(pod: Mapping[str, Any], policy: FailurePolicySpec) -> WorkerFailure:
    reason, line = pod_reason(pod)
    return WorkerFailure((pod.get("metadata") or {}).get("name", "?"), reason, line, policy.action(reason))


def policy_field(reason: str) -> str:
    """Where a reason's action is set: storage-full -> runPolicy.failurePolicy.storageFull."""
    return f"runPolicy.failurePolicy.{camel(reason.replace('-', '_'))}"


CONSEQUENCES = {
    RESTART: "restarted, counted against runPolicy.backoffLimit",
    RESTART_NOT_COUNTED: "retried without counting against runPolicy.backoffLimit",
    FAIL_JOB: "the job fails without a restart",
}


def consequence(failure: WorkerFailure) -> str:
    return f"{CONSEQUENCES[failure.action]} ({policy_field(failure.reason)}: {failure.action})"


def first_cause(failures: Sequence[WorkerFailure]) -> Optional[WorkerFailure]:
    """The failure that explains the others best (contract.cause_rank): a primary reason before a peer's echo."""
    return min(failures, key=lambda f: cause_rank(f.reason), default=None)
