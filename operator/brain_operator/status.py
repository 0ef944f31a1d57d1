"""A BrainTrainingJob's `status`, computed from what its children show (pure).

Nothing here reads the clock or the cluster: `now`, the pods (or the
PyTorchJob) and the previous status come in, a new status dict goes out.
Two rules hold whatever the children say: `restarts` never goes down, and a
terminal phase (Succeeded, Failed) never changes again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping, Optional, Sequence

from brain_trainer.exitcodes import PREEMPTED, PREEMPTED_MESSAGE

from .render.common import REPLICA_INDEX_LABEL

PENDING, RUNNING, RESTARTING = "Pending", "Running", "Restarting"
SUCCEEDED, FAILED, SUSPENDED = "Succeeded", "Failed", "Suspended"
PHASES = (PENDING, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED)
TERMINAL = (SUCCEEDED, FAILED)

# One condition per phase a user may wait on (`kubectl wait --for=condition=Succeeded`), plus Valid.
CONDITION_TYPES = ("Valid", RUNNING, RESTARTING, SUSPENDED, SUCCEEDED, FAILED)

# Failure reasons.
INVALID_SPEC = "InvalidSpec"
BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
DEADLINE_EXCEEDED = "DeadlineExceeded"

# Pod status reasons the kubelet or scheduler sets when it, not the trainer, ended the pod.
DISRUPTION_REASONS = ("Evicted", "Preempted", "Preempting")


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC, second precision, as Kubernetes writes timestamps."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class PodView:
    """What the status and the plan need to know about one worker pod."""

    name: str
    index: Optional[int]
    phase: str
    ready: bool
    terminating: bool
    disrupted: bool

    @property
    def finished(self) -> bool:
        return self.phase in (SUCCEEDED, FAILED)


def true_condition(status: Mapping[str, Any], kind: str) -> Optional[Mapping[str, Any]]:
    """The condition of type `kind` when its status is "True" (a pod's or a job's), else None."""
    return next(
        (c for c in status.get("conditions") or [] if c.get("type") == kind and c.get("status") == "True"), None
    )


def terminated_states(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The `state.terminated` record of each of the pod's containers that ended."""
    states = ((c.get("state") or {}).get("terminated") for c in (pod.get("status") or {}).get("containerStatuses") or [])
    return [t for t in states if t]


def pod_view(pod: Mapping[str, Any]) -> PodView:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    return PodView(
        name=meta.get("name", ""),
        index=_replica_index(meta),
        phase=status.get("phase") or PENDING,
        ready=true_condition(status, "Ready") is not None,
        terminating=bool(meta.get("deletionTimestamp")),
        disrupted=is_disruption(pod),
    )


def _replica_index(meta: Mapping[str, Any]) -> Optional[int]:
    text = (meta.get("labels") or {}).get(REPLICA_INDEX_LABEL, "")
    return int(text) if text.isdigit() else None


def is_disruption(pod: Mapping[str, Any]) -> bool:
    """Whether the pod ended because something outside the job stopped it.

    Evictions, preemptions and node drains are retried for free; so is a
    trainer that exited with PREEMPTED after checkpointing on SIGTERM.
    """
    status = pod.get("status") or {}
    if status.get("reason") in DISRUPTION_REASONS:
        return True
    if true_condition(status, "DisruptionTarget") is not None:
        return True
    return any(
        t.get("exitCode") == PREEMPTED or PREEMPTED_MESSAGE in (t.get("message") or "") for t in terminated_states(pod)
    )


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


def is_terminal(previous: Mapping[str, Any]) -> bool:
    """A finished job, except one that failed only because its spec was invalid (a fixed spec may run)."""
    return previous.get("phase") in TERMINAL and failure_reason(previous) != INVALID_SPEC


def failure_reason(previous: Mapping[str, Any]) -> Optional[str]:
    return (true_condition(previous, FAILED) or {}).get("reason")


def worker_counts(pods: Sequence[PodView], desired: int) -> dict[str, int]:
    live = [p for p in pods if not p.terminating]
    return {
        "desired": desired,
        "ready": sum(p.phase == RUNNING and p.ready for p in live),
        "running": sum(p.phase == RUNNING for p in live),
        "succeeded": sum(p.phase == SUCCEEDED for p in live),
        "failed": sum(p.phase == FAILED for p in live),
    }


def all_succeeded(pods: Sequence[PodView], desired: int) -> bool:
    done = {p.index for p in pods if p.phase == SUCCEEDED and not p.terminating}
    return desired > 0 and all(i in done for i in range(desired))


_VALID = (True, "SpecValid", "")


def elastic_status(previous: Mapping[str, Any], seen: Observation, now: datetime) -> dict[str, Any]:
    """The new status of an elastic job; a terminal one only refreshes its counts."""
    workers = worker_counts(seen.pods, seen.desired)
    restarts = max(seen.restarts, int(previous.get("restarts") or 0))
    if seen.failure is not None:
        phase, reason, message = FAILED, seen.failure.reason, seen.failure.message
    elif seen.suspended:
        phase, reason, message = SUSPENDED, "Suspended", "spec.runPolicy.suspend is true: worker pods deleted"
    elif all_succeeded(seen.pods, seen.desired):
        phase, reason, message = SUCCEEDED, "AllWorkersSucceeded", f"all {seen.desired} workers succeeded"
    elif seen.replaced:
        phase, reason, message = RESTARTING, "WorkersReplaced", f"{seen.replaced} worker pod(s) replaced"
    elif workers["running"] + workers["succeeded"] >= seen.min_running:
        # Workers that already finished training count: the others are finishing too.
        phase, reason, message = RUNNING, "WorkersRunning", f"{workers['running']}/{seen.desired} workers running"
    elif previous.get("phase") in (RUNNING, RESTARTING):
        phase, reason, message = RESTARTING, "WaitingForWorkers", f"{workers['running']}/{seen.min_running} workers running"
    else:
        phase, reason, message = PENDING, "WaitingForWorkers", f"{workers['running']}/{seen.min_running} workers running"
    out = _base(previous, seen.generation)
    out.update(_counts(workers, seen.selector), restarts=restarts, strategy=seen.strategy,
               effectiveBatchSize=seen.effective_batch_size)
    if not is_terminal(previous):
        out.update(phase=phase, conditions=_conditions(previous, phase, reason, message, now, valid=_VALID))
        _stamp_times(out, previous, phase, now)
    return out


def invalid_status(previous: Mapping[str, Any], generation: int, message: str, now: datetime) -> dict[str, Any]:
    """An invalid spec: Failed with Valid=False naming every bad field; nothing else changes.

    A finished job stays finished whatever its spec becomes.
    """
    out = _base(previous, generation)
    if is_terminal(previous):
        return out
    out.update(
        phase=FAILED,
        conditions=_conditions(previous, FAILED, INVALID_SPEC, message, now, valid=(False, INVALID_SPEC, message)),
    )
    return out


# Kubeflow's PyTorchJob condition types, most decisive first.
_KUBEFLOW_PHASES = ((FAILED, FAILED), (SUCCEEDED, SUCCEEDED), (SUSPENDED, SUSPENDED),
                    (RESTARTING, RESTARTING), (RUNNING, RUNNING), ("Created", PENDING))


def pytorchjob_status(
    previous: Mapping[str, Any],
    pytorchjob: Optional[Mapping[str, Any]],
    *,
    generation: int,
    desired: int,
    strategy: str,
    effective_batch_size: int,
    selector: str,
    now: datetime,
) -> dict[str, Any]:
    """The new status of a job delegated to Kubeflow, read from its PyTorchJob's conditions."""
    kf_status = (pytorchjob or {}).get("status") or {}
    kf_conditions = {c.get("type"): c for c in kf_status.get("conditions") or [] if c.get("status") == "True"}
    phase, reason, message, since = PENDING, "PyTorchJobPending", "waiting for the PyTorchJob", None
    for kf_type, ours in _KUBEFLOW_PHASES:
        if kf_type in kf_conditions:
            found = kf_conditions[kf_type]
            phase, reason = ours, found.get("reason") or kf_type
            message, since = found.get("message") or "", found.get("lastTransitionTime")
            break
    restarts = int(previous.get("restarts") or 0)
    if phase == RESTARTING and since and since != (true_condition(previous, RESTARTING) or {}).get("lastTransitionTime"):
        # Each new Restarting transition of the PyTorchJob is one restart; our
        # Restarting condition keeps its time, so a repeat read does not count twice.
        restarts += 1
    out = _base(previous, generation)
    out.update(
        _counts(_kubeflow_workers(kf_status, desired), selector),
        restarts=restarts,
        strategy=strategy,
        effectiveBatchSize=effective_batch_size,
    )
    if not is_terminal(previous):
        out.update(phase=phase, conditions=_conditions(previous, phase, reason, message, now, valid=_VALID, since=since))
        _stamp_times(out, previous, phase, now, reported=kf_status)
    return out


def _kubeflow_workers(kf_status: Mapping[str, Any], desired: int) -> dict[str, int]:
    replicas = (kf_status.get("replicaStatuses") or {}).values()
    running = sum(int(r.get("active") or 0) for r in replicas)
    return {
        "desired": desired,
        # Kubeflow reports no readiness: an active replica is the best it says.
        "ready": running,
        "running": running,
        "succeeded": sum(int(r.get("succeeded") or 0) for r in replicas),
        "failed": sum(int(r.get("failed") or 0) for r in replicas),
    }


def _counts(workers: dict[str, int], selector: str) -> dict[str, Any]:
    # `nodes` feeds the Nodes printer column; `selector` the scale subresource (kubectl scale, HPA).
    return {"workers": workers, "nodes": f"{workers['ready']}/{workers['desired']}", "selector": selector}


def _base(previous: Mapping[str, Any], generation: int) -> dict[str, Any]:
    # Keep what others write (progress, lastCheckpoint) and what is sticky.
    out = dict(previous)
    out["observedGeneration"] = generation
    return out


def _stamp_times(
    out: dict[str, Any], previous: Mapping[str, Any], phase: str, now: datetime,
    reported: Mapping[str, Any] | None = None,
) -> None:
    reported = reported or {}
    if phase == SUSPENDED:
        # As for a Kubernetes Job: the deadline clock restarts on resume.
        out.pop("startTime", None)
    elif phase != PENDING or previous.get("startTime"):
        out["startTime"] = previous.get("startTime") or reported.get("startTime") or format_time(now)
    if phase in TERMINAL and not out.get("completionTime"):
        out["completionTime"] = reported.get("completionTime") or format_time(now)


def _conditions(
    previous: Mapping[str, Any],
    phase: str,
    reason: str,
    message: str,
    now: datetime,
    *,
    valid: tuple[bool, str, str],
    since: Optional[str] = None,
) -> list[dict[str, str]]:
    old = {c.get("type"): c for c in previous.get("conditions") or []}
    out = []
    for kind in CONDITION_TYPES:
        if kind == "Valid":
            truth, why, text = valid
        elif kind == phase:
            truth, why, text = True, reason, message
        else:
            truth, why, text = False, phase, ""
        status = "True" if truth else "False"
        before = old.get(kind)
        if before is not None and before.get("status") == status:
            changed_at = before.get("lastTransitionTime") or format_time(now)
        else:
            changed_at = (since if truth and kind == phase and since else None) or format_time(now)
        out.append({"type": kind, "status": status, "reason": why, "message": text, "lastTransitionTime": changed_at})
    return out

