"""Kubernetes Events worth posting on a BrainTrainingJob (pure).

One event per phase transition, one per change of why worker pods wait
(the WorkersReady condition: Unschedulable, ImagePullBackOff, ...) and one
per worker failure, carrying the
pod's exit code and Kubernetes' reason (OOMKilled, Error, Evicted, ...), the
trainer's own reason and line (failure_policy.py), and what the failure
policy does about it, so `kubectl describe btj` tells the story without
digging through pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from .failure_policy import WorkerFailure, consequence, explain
from .job_status import CREATE_REFUSED, FAILED, RESTARTING, VALID, WORKERS_READY, JobStatus
from ..objects.pods import disruption_condition, terminated_states
from ..spec.model import FailurePolicySpec

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
    # A pod-level reason (Evicted, Preempted) explains more than the container's; a pod deleted while it ran
    # has only its DisruptionTarget's (DeletionByTaintManager, PreemptionByScheduler, ...).
    target = disruption_condition(status) or {}
    reason = status.get("reason") or terminated.get("reason") or target.get("reason") or "Error"
    return PodExit(reason=reason, exit_code=terminated.get("exitCode"))


def _ended(pod: Mapping[str, Any], policy: FailurePolicySpec) -> tuple[WorkerFailure, str]:
    """The failure as `policy` judges it, and the text both worker events open with: how the pod ended."""
    ended, failure = pod_exit(pod), explain(pod, policy)
    code = "no exit code" if ended.exit_code is None else f"exit code {ended.exit_code}"
    return failure, f"worker pod {failure.pod} ended with {ended.reason} ({code}): {failure.reason}: {failure.line}; "


def worker_failure_event(pod: Mapping[str, Any], policy: FailurePolicySpec) -> Event:
    failure, text = _ended(pod, policy)
    return Event(WARNING, "WorkerFailed", f"{text}{consequence(failure)}")


def worker_exit_event(pod: Mapping[str, Any], policy: FailurePolicySpec, why: str) -> Event:
    """A worker that ended because of an incident already counted (`why`: after whose failure), or while a peer it
    needs is not there: replaced, not counted (incidents.py)."""
    _, text = _ended(pod, policy)
    return Event(NORMAL, "WorkerExited", f"{text}{why}: replaced, not counted against runPolicy.backoffLimit")


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
    a new reason for workers to wait (or the end of one), then the phase change if any."""
    events = [worker_failure_event(pod, policy or FailurePolicySpec()) for pod in failed_pods]
    events += waiting_events(before, status)
    transition = phase_event(before.phase, status.phase, _phase_message(status))
    if transition is not None:
        events.append(transition)
    return events


def _phase_message(status: JobStatus) -> str:
    condition = status.condition(status.phase) if status.phase else None
    return (condition.message if condition else None) or ""


def in_pod_restart_event(before: JobStatus, status: JobStatus) -> Optional[Event]:
    """A Warning InPodRestart when rank 0's document counts more in-pod restarts than the status did: torchrun
    restarted the workers inside a pod, which no pod event shows."""
    more = status.in_pod_restarts - before.in_pod_restarts
    if more <= 0:
        return None
    why = f" after {status.last_in_pod_restart}" if status.last_in_pod_restart else ""
    return Event(WARNING, "InPodRestart",
                 f"torchrun restarted the workers inside a pod{why} ({more} more, {status.in_pod_restarts} in all; "
                 f"elastic.maxRestarts bounds them per pod)")


def overlay_refusal_event(before: JobStatus, status: JobStatus) -> Optional[Event]:
    """A Warning naming each overlay field the operator's policy no longer allows, and its setting, once per
    distinct message (status's Valid=False, see status.overlay_refused_status)."""
    new, old = status.find(VALID), before.find(VALID)
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


# WorkersReady reasons that say only "not yet" or "not any more": no event of their own.
_PLAIN_READINESS = ("AllWorkersReady", "WaitingForWorkers")


def waiting_events(before: JobStatus, status: JobStatus) -> list[Event]:
    """A Warning with the reason and the pods when why the workers wait changes (not on every pass that still
    waits); a Normal WorkersReady when they are all ready after one."""
    new, old = status.find(WORKERS_READY), before.find(WORKERS_READY)
    if new is None or (old is not None and (old.status, old.reason, old.message) == (new.status, new.reason,
                                                                                    new.message)):
        return []
    if new.status == "False" and new.reason and new.reason not in _PLAIN_READINESS and new.reason != status.phase:
        return [Event(WARNING, new.reason, new.message or "")]
    waited = old is not None and old.status == "False" and old.reason not in (*_PLAIN_READINESS, before.phase)
    if new.status == "True" and waited:
        return [Event(NORMAL, WORKERS_READY, new.message or "")]
    return []
