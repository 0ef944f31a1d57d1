"""What a worker pod says about itself: its index, phase and readiness, and whether something outside the job ended it (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping, Optional

from brain_trainer.contract import PREEMPTED, PREEMPTED_MESSAGE, parse_time

from .names import REPLICA_INDEX_LABEL
from .schedulers import TERMINATION_TARGET, gated_by_kueue

PENDING, RUNNING, SUCCEEDED, FAILED = "Pending", "Running", "Succeeded", "Failed"

# Pod status reasons the kubelet or scheduler sets when it, not the trainer, ended the pod.
DISRUPTION_REASONS = ("Evicted", "Preempted", "Preempting")
# The condition Kubernetes puts on a pod it is about to delete or stop for a disruption (PreemptionByScheduler,
# EvictionByEvictionAPI, DeletionByTaintManager, TerminationByKubelet, ...: kubernetes pkg/apis/core/types.go);
# the Job controller does not count such a pod against its backoffLimit under a podFailurePolicy that says so
# (pkg/controller/job).
DISRUPTION_TARGET = "DisruptionTarget"


@dataclass(frozen=True)
class PodView:
    """What the status and the plan need to know about one worker pod."""

    name: str
    index: Optional[int]
    phase: str
    ready: bool
    terminating: bool
    # Kueue's admission gate is on: the pod waits for its group to be admitted.
    gated: bool = False

    @property
    def finished(self) -> bool:
        return self.phase in (SUCCEEDED, FAILED)


def disruption_condition(status: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    """The condition that says something outside the job is stopping the pod: Kubernetes' DisruptionTarget, or
    Kueue's TerminationTarget on a pod of an evicted or preempted Workload."""
    return true_condition(status, DISRUPTION_TARGET) or true_condition(status, TERMINATION_TARGET)


def true_condition(status: Mapping[str, Any], kind: str) -> Optional[Mapping[str, Any]]:
    """The condition of type `kind` when its status is "True", else None."""
    return next(
        (c for c in status.get("conditions") or [] if c.get("type") == kind and c.get("status") == "True"), None
    )


def terminated_states(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The `state.terminated` record of each of the pod's containers that ended."""
    states = ((c.get("state") or {}).get("terminated") for c in (pod.get("status") or {}).get("containerStatuses") or [])
    return [t for t in states if t]


def ended_at(pod: Mapping[str, Any]) -> Optional[datetime]:
    """When the pod ended: its containers' latest `finishedAt`, else (deleted while it ran) when its
    DisruptionTarget condition was set; None when it says neither in a form we read."""
    finished = [_time(t.get("finishedAt")) for t in terminated_states(pod)]
    known = [t for t in finished if t is not None]
    if known:
        return max(known)
    return _time((disruption_condition(pod.get("status") or {}) or {}).get("lastTransitionTime"))


def created_at(pod: Mapping[str, Any]) -> Optional[datetime]:
    return _time((pod.get("metadata") or {}).get("creationTimestamp"))


def _time(text: Any) -> Optional[datetime]:
    try:
        return parse_time(text) if isinstance(text, str) else None
    except ValueError:
        return None


def pod_view(pod: Mapping[str, Any]) -> PodView:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    return PodView(
        name=meta.get("name", ""),
        index=_replica_index(meta),
        phase=status.get("phase") or PENDING,
        ready=true_condition(status, "Ready") is not None,
        terminating=bool(meta.get("deletionTimestamp")),
        gated=gated_by_kueue(pod),
    )


def _replica_index(meta: Mapping[str, Any]) -> Optional[int]:
    text = (meta.get("labels") or {}).get(REPLICA_INDEX_LABEL, "")
    return int(text) if text.isdigit() else None


def is_disruption(pod: Mapping[str, Any]) -> bool:
    """Whether the pod ended because something outside the job stopped it.

    Evictions, preemptions (Kueue's too) and node drains are retried for free; so is a
    trainer that exited with PREEMPTED after checkpointing on SIGTERM.
    """
    status = pod.get("status") or {}
    if status.get("reason") in DISRUPTION_REASONS:
        return True
    if disruption_condition(status) is not None:
        return True
    return any(
        t.get("exitCode") == PREEMPTED or PREEMPTED_MESSAGE in (t.get("message") or "") for t in terminated_states(pod)
    )
