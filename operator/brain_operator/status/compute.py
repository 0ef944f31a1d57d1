"""A BrainTrainingJob's `status`, computed from what its children show (pure).

Nothing here reads the clock or the cluster: `now`, the pods (or the
PyTorchJob) and the previous status come in, a new status goes out, both
typed `JobStatus` (reconcile.apply serialises it once, as it writes it).
Two rules hold whatever the children say: `restarts` never goes down, and a
terminal phase (Succeeded, Failed) never changes again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Iterable, Mapping, Optional, Sequence

from brain_trainer.contract import format_time

from .failure_policy import WorkerFailure
from .job_status import (
    CONDITION_TYPES,
    FAILED,
    PENDING,
    PHASES,
    QUEUED,
    RESTARTING,
    RUNNING,
    SUCCEEDED,
    SUSPENDED,
    TERMINAL,
    CREATE_REFUSED,
    VALID,
    WORKERS_READY,
    Condition,
    Incident,
    JobStatus,
    WorkerCounts,
)
from ..objects.pods import PodView, true_condition
from .waiting import Waiting

__all__ = [
    "BACKEND_UNAVAILABLE",
    "BACKOFF_LIMIT_EXCEEDED",
    "CHECKPOINT_STORAGE_TOO_SMALL",
    "CONDITION_TYPES",
    "DEADLINE_EXCEEDED",
    "FAILED",
    "FAILED_CREATE",
    "INTERNAL_ERROR",
    "INVALID_SPEC",
    "OVERLAY_NOT_ALLOWED",
    "PENDING",
    "PHASES",
    "QUEUED",
    "RESTARTING",
    "RUNNING",
    "SUCCEEDED",
    "SUSPENDED",
    "TERMINAL",
    "Failure",
    "Observation",
    "all_succeeded",
    "carried_refusal",
    "clock_start",
    "container_restart_count",
    "elastic_status",
    "invalid_status",
    "is_terminal",
    "overlay_refused_status",
    "pytorchjob_status",
    "refused_status",
    "worker_counts",
]

# Failure reasons.
INVALID_SPEC = "InvalidSpec"
# A volumeClaimTemplate too small for the checkpoints (sizing/storage.py).
CHECKPOINT_STORAGE_TOO_SMALL = "CheckpointStorageTooSmall"
# A spec the operator failed on while parsing or rendering it (a bug of ours): another pass fails the same way.
INTERNAL_ERROR = "InternalError"
# The cluster does not serve (or the operator may not use) an optional API the job needs (cluster/discovery.py).
BACKEND_UNAVAILABLE = "BackendUnavailable"
# Reasons of a spec refused before anything ran: fixing the spec, the operator or the cluster starts the job.
SPEC_REASONS = (INVALID_SPEC, CHECKPOINT_STORAGE_TOO_SMALL, INTERNAL_ERROR, BACKEND_UNAVAILABLE)
# A running job whose pod overlay the operator's policy no longer allows (Valid=False; its pods run on).
OVERLAY_NOT_ALLOWED = "OverlayNotAllowed"
# The API server refused to create a child (the Job controller's and ReplicaSet's event reason for the same).
FAILED_CREATE = "FailedCreate"
BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
DEADLINE_EXCEEDED = "DeadlineExceeded"


@dataclass(frozen=True)
class Failure:
    reason: str
    message: str


@dataclass(frozen=True)
class Observation:
    """What one reconcile of an elastic job saw and decided, the input of its status.

    `pods` are the worker pods left after the plan's deletions; `restarts` is
    the new total, already counting the replacements this pass made.
    """

    generation: int
    desired: int
    min_running: int
    pods: Sequence[PodView]
    restarts: int
    replaced: int
    suspended: bool
    failure: Optional[Failure]
    strategy: str
    effective_batch_size: int
    selector: str
    # (reason, message) while Kueue holds the workers back, as Kueue gives them.
    queued: Optional[tuple[str, str]] = None
    # The worker failure this pass handled that explains the others (failure_policy.first_cause).
    cause: Optional[WorkerFailure] = None
    # uids of the failed pods handled so far (accounting.py); None keeps the previous list.
    handled_failures: Optional[Sequence[str]] = None
    # Why worker pods wait, as the scheduler and the kubelet say (waiting.py).
    waiting: Optional[Waiting] = None
    # The job's metadata.creationTimestamp: its deadline clock's start.
    created: Optional[str] = None
    # The latest incident (incidents.py), recorded in status.incident.
    incident: Optional[Incident] = None


def is_terminal(previous: JobStatus) -> bool:
    """A finished job, except one that failed only because its spec was invalid (a fixed spec may run)."""
    return previous.phase in TERMINAL and failure_reason(previous) not in SPEC_REASONS


def failure_reason(previous: JobStatus) -> Optional[str]:
    failed = previous.condition(FAILED)
    return failed.reason if failed else None


def worker_counts(pods: Sequence[PodView], desired: int) -> WorkerCounts:
    live = [p for p in pods if not p.terminating]
    return WorkerCounts(
        desired=desired,
        ready=sum(p.phase == RUNNING and p.ready for p in live),
        running=sum(p.phase == RUNNING for p in live),
        succeeded=sum(p.phase == SUCCEEDED for p in live),
        failed=sum(p.phase == FAILED for p in live),
    )


def all_succeeded(pods: Sequence[PodView], desired: int) -> bool:
    done = {p.index for p in pods if p.phase == SUCCEEDED and not p.terminating}
    return desired > 0 and all(i in done for i in range(desired))


_VALID = (True, "SpecValid", "")


def elastic_status(before: JobStatus, seen: Observation, now: datetime) -> JobStatus:
    """The new status of an elastic job; a terminal one only refreshes its counts."""
    workers = worker_counts(seen.pods, seen.desired)
    if seen.failure is not None:
        phase, reason, message = FAILED, seen.failure.reason, seen.failure.message
    elif seen.suspended:
        phase, reason, message = SUSPENDED, "Suspended", "spec.runPolicy.suspend is true: worker pods deleted"
    elif all_succeeded(seen.pods, seen.desired):
        phase, reason, message = SUCCEEDED, "AllWorkersSucceeded", f"all {seen.desired} workers succeeded"
    elif seen.replaced:
        phase, reason, message = RESTARTING, "WorkersReplaced", f"{seen.replaced} worker pod(s) replaced"
        if seen.cause is not None:
            reason, message = seen.cause.condition_reason, f"{message}: {seen.cause.text()}"
    elif workers.running + workers.succeeded >= seen.min_running:
        # Workers that already finished training count: the others are finishing too.
        phase, reason, message = RUNNING, "WorkersRunning", f"{workers.running}/{seen.desired} workers running"
    elif seen.queued is not None:
        phase, (reason, message) = QUEUED, seen.queued
    elif before.phase in (RUNNING, RESTARTING):
        phase, reason, message = RESTARTING, "WaitingForWorkers", f"{workers.running}/{seen.min_running} workers running"
    else:
        phase, reason, message = PENDING, "WaitingForWorkers", f"{workers.running}/{seen.min_running} workers running"
    if reason == "WaitingForWorkers" and seen.waiting is not None:
        reason, message = seen.waiting.reason, seen.waiting.text()
    out = _counted(before, seen.generation, workers, seen.selector, max(seen.restarts, before.restarts),
                   seen.strategy, seen.effective_batch_size)
    if not is_terminal(before):
        out = replace(out, reason=_reason(before, seen))
    if seen.handled_failures is not None:
        out = replace(out, handled_failures=list(seen.handled_failures) or None)
    if seen.incident is not None:
        out = replace(out, incident=seen.incident)
    if not is_terminal(before):
        conditions = _conditions(before, phase, reason, message, now, valid=_VALID)
        out = _moved(out, before, phase, [*conditions, _workers_ready(before, phase, workers, seen.waiting, now)], now,
                     created=seen.created)
    return out


def _reason(before: JobStatus, seen: Observation) -> Optional[str]:
    """`status.reason`: this pass's worker failure, else why workers wait; a wait that ended clears it."""
    if seen.cause is not None:
        return seen.cause.reason
    return _waiting_reason(before, seen.waiting)


def _waiting_reason(before: JobStatus, wait: Optional[Waiting]) -> Optional[str]:
    """`status.reason` from why workers wait; a wait that ended clears it, another reason stays."""
    if wait is not None:
        return wait.reason
    old = before.find(WORKERS_READY)
    waited = old is not None and old.status == "False" and old.reason == before.reason
    return None if waited else before.reason


def _workers_ready(before: JobStatus, phase: str, workers: WorkerCounts, wait: Optional[Waiting],
                   now: datetime) -> Condition:
    """WorkersReady: True once every desired worker is ready; False naming why and which pods, while they wait."""
    if phase in (*TERMINAL, SUSPENDED):
        truth, why, text = False, phase, ""
    elif workers.ready >= workers.desired:
        truth, why, text = True, "AllWorkersReady", f"{workers.ready}/{workers.desired} worker pods ready"
    elif wait is not None:
        truth, why, text = False, wait.reason, wait.text()
    else:
        truth, why, text = False, "WaitingForWorkers", f"{workers.ready}/{workers.desired} worker pods ready"
    status = "True" if truth else "False"
    old = before.find(WORKERS_READY)
    return Condition(WORKERS_READY, status, why, text, _transition_time(old, status, now))


def _transition_time(old: Optional[Condition], status: str, now: datetime, fresh: Optional[str] = None) -> str:
    """A condition's lastTransitionTime: `old`'s while its status is still `status`, else `fresh` (or `now`)."""
    if old is not None and old.status == status:
        return old.last_transition_time or format_time(now)
    return fresh or format_time(now)


def invalid_status(before: JobStatus, generation: int, message: str, now: datetime,
                   reason: str = INVALID_SPEC) -> JobStatus:
    """An invalid spec: Failed with Valid=False (`reason`, one of SPEC_REASONS) naming every bad field; nothing else
    changes.

    A finished job stays finished whatever its spec becomes.
    """
    out = replace(before, observed_generation=generation)
    if not is_terminal(before):
        out = replace(out, phase=FAILED,
                      conditions=_conditions(before, FAILED, reason, message, now, valid=(False, reason, message)))
    return out


def overlay_refused_status(status: JobStatus, before: JobStatus, message: str, now: datetime) -> JobStatus:
    """`status` of a job whose running pods' overlay the operator's policy no longer allows: Valid=False
    (OverlayNotAllowed, `message`), since the pass that first said so; the phase stays the pods'."""
    old = before.find(VALID)
    valid = Condition(VALID, "False", OVERLAY_NOT_ALLOWED, message, _transition_time(old, "False", now))
    return replace(status, conditions=[valid if c.type == VALID else c for c in status.conditions])


def refused_status(status: JobStatus, message: str, now: datetime) -> JobStatus:
    """`status` with the API server's refusal of a create: CreateRefused=True (FailedCreate, its `message`) and
    `reason`. The phase stays: the job waits for what could not be created."""
    old = status.find(CREATE_REFUSED)
    refusal = Condition(CREATE_REFUSED, "True", FAILED_CREATE, message, _transition_time(old, "True", now))
    return replace(status, reason=FAILED_CREATE, conditions=[*_without_refusal(status), refusal])


def carried_refusal(status: JobStatus, before: JobStatus, creating: bool) -> JobStatus:
    """The previous pass's CreateRefused while this one still has children to create; gone once none is missing.

    Whether this pass's creates are refused again is known only as they are made (reconcile.apply).
    """
    refusal = before.condition(CREATE_REFUSED)
    return replace(status, conditions=[*_without_refusal(status), *([refusal] if refusal and creating else [])])


def _without_refusal(status: JobStatus) -> list[Condition]:
    return [c for c in status.conditions if c.type != CREATE_REFUSED]


# Kubeflow's PyTorchJob condition types, most decisive first.
_KUBEFLOW_PHASES = ((FAILED, FAILED), (SUCCEEDED, SUCCEEDED), (SUSPENDED, SUSPENDED),
                    (RESTARTING, RESTARTING), (RUNNING, RUNNING), ("Created", PENDING))


def pytorchjob_status(
    before: JobStatus,
    pytorchjob: Optional[Mapping[str, Any]],
    *,
    generation: int,
    desired: int,
    strategy: str,
    effective_batch_size: int,
    selector: str,
    now: datetime,
    queued: Optional[tuple[str, str]] = None,
    waiting: Optional[Waiting] = None,
    container_restarts: Optional[int] = None,
) -> JobStatus:
    """The new status of a job delegated to Kubeflow, read from its PyTorchJob's conditions.

    `queued` (Kueue's reason and message) while Kueue keeps the PyTorchJob suspended; `waiting`, why the pods
    Kubeflow made wait (waiting.py), names the reason of a Pending or Restarting job, as for the elastic backend.
    `container_restarts`, the restartCount of Kubeflow's pods' containers summed (`container_restart_count`): each
    rise since the last pass is a restart, as Kubeflow counts it against its backoffLimit (training-operator
    pkg/controller.v1/common/job.go, pastBackoffLimit sums the restartCount of OnFailure replicas' containers).
    """
    kf_status = (pytorchjob or {}).get("status") or {}
    phase, reason, message, since = PENDING, "PyTorchJobPending", "waiting for the PyTorchJob", None
    for kf_type, ours in _KUBEFLOW_PHASES:
        found = true_condition(kf_status, kf_type)
        if found is not None:
            phase, reason = ours, found.get("reason") or kf_type
            message, since = found.get("message") or "", found.get("lastTransitionTime")
            break
    if queued is not None and phase in (PENDING, SUSPENDED):
        phase, (reason, message), since = QUEUED, queued, None
    elif waiting is not None and phase in (PENDING, RESTARTING):
        reason, message = waiting.reason, waiting.text()
    restarts = before.restarts
    restarting = before.condition(RESTARTING)
    if phase == RESTARTING and since and since != (restarting.last_transition_time if restarting else None):
        # Each new Restarting transition of the PyTorchJob is one restart; our
        # Restarting condition keeps its time, so a repeat read does not count twice.
        restarts += 1
    if container_restarts is not None:
        # Replaced pods start from 0 again: only a rise since the last pass is new.
        restarts += max(0, container_restarts - (before.container_restarts or 0))
    workers = _kubeflow_workers(kf_status, desired)
    out = _counted(before, generation, workers, selector, restarts, strategy, effective_batch_size)
    out = replace(out, container_restarts=container_restarts if container_restarts is not None
                  else before.container_restarts)
    if not is_terminal(before):
        out = replace(out, reason=_waiting_reason(before, waiting))
        conditions = _conditions(before, phase, reason, message, now, valid=_VALID, since=since)
        out = _moved(out, before, phase, [*conditions, _workers_ready(before, phase, workers, waiting, now)], now,
                     reported=kf_status)
    return out


def container_restart_count(pods: Iterable[Mapping[str, Any]]) -> int:
    """The restartCount of the pods' containers, summed (restartPolicy OnFailure restarts them in place)."""
    return sum(int(c.get("restartCount") or 0) for pod in pods
               for c in (pod.get("status") or {}).get("containerStatuses") or ())


def _kubeflow_workers(kf_status: Mapping[str, Any], desired: int) -> WorkerCounts:
    replicas = (kf_status.get("replicaStatuses") or {}).values()
    running = sum(int(r.get("active") or 0) for r in replicas)
    # Kubeflow reports no readiness: an active replica is the best it says.
    return WorkerCounts(
        desired=desired,
        ready=running,
        running=running,
        succeeded=sum(int(r.get("succeeded") or 0) for r in replicas),
        failed=sum(int(r.get("failed") or 0) for r in replicas),
    )


def _counted(
    before: JobStatus, generation: int, workers: WorkerCounts, selector: str, restarts: int, strategy: str,
    effective_batch_size: int,
) -> JobStatus:
    """The previous status (its progress fields change only with rank 0's document: progress.py) with this pass's
    counts."""
    # `nodes` feeds the Nodes printer column; `selector` the scale subresource (kubectl scale, HPA).
    return replace(
        before,
        observed_generation=generation,
        workers=workers,
        nodes=f"{workers.ready}/{workers.desired}",
        selector=selector,
        restarts=restarts,
        strategy=strategy,
        effective_batch_size=effective_batch_size,
    )


# Phases the deadline clock does not run in. A Kubernetes Job's startTime is set only while it is not suspended and
# cleared when it is (pkg/controller/job/job_controller.go syncJob), and a job Kueue queues is suspended until its
# admission: so a queued job's clock starts at admission, a suspended one's on resume.
CLOCK_STOPPED = (SUSPENDED, QUEUED)


def clock_start(before: JobStatus, created: Optional[str], queued: bool = False) -> Optional[str]:
    """When the job's deadline clock started: None while Kueue holds every worker (`queued`), else `status.startTime`,
    else its creation (`created`) unless it is just leaving Suspended or Queued (then it starts now: CLOCK_STOPPED)."""
    if queued:
        return None
    return before.start_time or (created if before.phase not in CLOCK_STOPPED else None)


def _moved(
    out: JobStatus, before: JobStatus, phase: str, conditions: list[Condition], now: datetime,
    reported: Mapping[str, Any] | None = None, created: Optional[str] = None,
) -> JobStatus:
    """`out` in `phase`, with its conditions and start/completion times (`reported` by Kubeflow, if any); `created`
    is the job's creationTimestamp."""
    reported = reported or {}
    start_time = out.start_time
    if phase in CLOCK_STOPPED:
        # As for a Kubernetes Job: the deadline clock starts again on resume or admission.
        start_time = None
    else:
        # Pending included: activeDeadlineSeconds counts from here (backends/elastic/plan.py).
        start_time = before.start_time or reported.get("startTime") or clock_start(before, created) or format_time(now)
    completion_time = out.completion_time
    if phase in TERMINAL and not completion_time:
        completion_time = reported.get("completionTime") or format_time(now)
    return replace(out, phase=phase, conditions=conditions, start_time=start_time, completion_time=completion_time)


def _conditions(
    before: JobStatus,
    phase: str,
    reason: str,
    message: str,
    now: datetime,
    *,
    valid: tuple[bool, str, str],
    since: Optional[str] = None,
) -> list[Condition]:
    old = {c.type: c for c in before.conditions}
    out = []
    for kind in CONDITION_TYPES:
        if kind == VALID:
            truth, why, text = valid
        elif kind == phase:
            truth, why, text = True, reason, message
        else:
            truth, why, text = False, phase, ""
        status = "True" if truth else "False"
        changed_at = _transition_time(old.get(kind), status, now, since if truth and kind == phase else None)
        out.append(Condition(type=kind, status=status, reason=why, message=text, last_transition_time=changed_at))
    return out

