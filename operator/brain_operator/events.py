"""Kubernetes Events worth posting on a BrainTrainingJob (pure).

One event per phase transition and one per worker failure, carrying the
pod's exit code and Kubernetes' reason (OOMKilled, Error, Evicted, ...), the
trainer's own reason and line (failure_policy.py), and what the failure
policy does about it, so `kubectl describe btj` tells the story without
digging through pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from .failure_policy import consequence, explain
from .job_status import CREATE_REFUSED, FAILED, RESTARTING, VALID, JobStatus
from .pods import terminated_states
from .spec.model import FailurePolicySpec

NORMAL, WARNING = "Normal", "Warning"


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class PodExit:
    """How a worker pod ended, as the kubelet reported it."""

    reason: str
    exit_code: Optional[int]


def pod_exit(pod: Mapping[str, Any]) -> PodExit:
    status = pod.get("status") or {}
    terminated = next(iter(terminated_states(pod)), {})
    # A pod-level reason (Evicted, Preempted) explains more than the container's.
    reason = status.get("reason") or terminated.get("reason") or "Error"
    return PodExit(reason=reason, exit_code=terminated.get("exitCode"))


def worker_failure_event(pod: Mapping[str, Any], policy: FailurePolicySpec) -> Event:
    ended, failure = pod_exit(pod), explain(pod, policy)
    code = "no exit code" if ended.exit_code is None else f"exit code {ended.exit_code}"
    return Event(WARNING, "WorkerFailed",
                 f"worker pod {failure.pod} ended with {ended.reason} ({code}): {failure.reason}: {failure.line}; "
                 f"{consequence(failure)}")


def phase_event(previous_phase: Optional[str], phase: Optional[str], message: str = "") -> Optional[Event]:
    if not phase or phase == previous_phase:
        return None
    kind = WARNING if phase in (FAILED, RESTARTING) else NORMAL
    text = f"phase {previous_phase or 'None'} -> {phase}" + (f": {message}" if message else "")
    return Event(kind, phase, text)


def compute_events(
    before: JobStatus, status: JobStatus, failed_pods: Iterable[Mapping[str, Any]],
    policy: Optional[FailurePolicySpec] = None,
) -> list[Event]:
    """Events for one reconcile: its newly handled worker failures (judged by `policy`, default: the defaults),
    then the phase change if any."""
    events = [worker_failure_event(pod, policy or FailurePolicySpec()) for pod in failed_pods]
    transition = phase_event(before.phase, status.phase, _phase_message(status))
    if transition is not None:
        events.append(transition)
    return events


def _phase_message(status: JobStatus) -> str:
    condition = status.condition(status.phase) if status.phase else None
    return (condition.message if condition else None) or ""


def overlay_refusal_event(before: JobStatus, status: JobStatus) -> Optional[Event]:
    """A Warning naming each overlay field the operator's policy no longer allows, and its setting, once per
    distinct message (status's Valid=False, see status.overlay_refused_status)."""
    new, old = (next((c for c in s.conditions if c.type == VALID), None) for s in (status, before))
    if new is None or new.status != "False" or (old is not None and old.status == "False" and old.message == new.message):
        return None
    return Event(WARNING, new.reason or "", new.message or "")


def refusal_event(before: JobStatus, status: JobStatus) -> Optional[Event]:
    """A Warning FailedCreate with the API server's message, once per distinct message (a pass that is refused
    again the same way adds nothing to `kubectl describe`)."""
    new, old = status.condition(CREATE_REFUSED), before.condition(CREATE_REFUSED)
    if new is None or (old is not None and old.message == new.message):
        return None
    return Event(WARNING, new.reason or "FailedCreate", new.message or "")
