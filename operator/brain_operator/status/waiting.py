"""Why a job's worker pods are not running, as the scheduler and the kubelet say it in the pods' status (pure).

What Kubernetes writes where (so the operator reads the pod, never its events):

- the scheduler: condition PodScheduled=False, reason Unschedulable, its FitError as the message
  ("0/8 nodes are available: 8 Insufficient nvidia.com/gpu."; kubernetes pkg/scheduler/schedule_one.go,
  handleSchedulingFailure);
- the kubelet: a container's state.waiting {reason, message}: ErrImagePull and ImagePullBackOff
  ('Back-off pulling image "..."', pkg/kubelet/images/image_manager.go), CreateContainerConfigError
  ('secret "x" not found', pkg/kubelet/kubelet_pods.go makeEnvironmentVariables), ...;
- a volume that does not attach or mount is only an event (FailedAttachVolume, FailedMount): the pod
  status says no more than ContainerCreating with no message (pkg/kubelet/kubelet_pods.go,
  convertToAPIContainerStatuses), so a pod still ContainerCreating long after it was scheduled is
  reported with where to look;
- a pod whose node is lost keeps its deletionTimestamp (the end of its grace) and is never removed
  (pkg/controller/podgc/gc_controller.go frees it only once the Node is gone or out of service).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Iterable, Mapping, Optional

from brain_trainer.contract import parse_time

from ..objects.schedulers import KUEUE_POD_FINALIZER, gated_by_kueue

UNSCHEDULABLE = "Unschedulable"
CONTAINER_CREATING = "ContainerCreating"
STUCK_TERMINATING = "StuckTerminating"
# Children an earlier job of the same name left (another owner uid): this one starts once they are gone.
EARLIER_JOB = "EarlierJobTerminating"
RUN_CONTAINER_ERROR = "RunContainerError"
# Container waiting reasons of a normal start: not worth a word until they last (ContainerCreating) or never.
STARTING = ("PodInitializing", CONTAINER_CREATING)
# Most decisive first: a broken pod spec (secret, image) before the cluster's capacity, capacity before time.
PRIORITY = ("CreateContainerConfigError", "InvalidImageName", "ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff",
            "CreateContainerError", RUN_CONTAINER_ERROR, "CrashLoopBackOff", UNSCHEDULABLE, STUCK_TERMINATING,
            EARLIER_JOB, CONTAINER_CREATING)
# A scheduled pod still creating its containers this long is waiting for a volume (or a very large image).
CONTAINER_CREATING_SECONDS = 180
# Past its deletionTimestamp (the end of its grace) plus this, a Terminating pod is not going away on its own.
TERMINATING_MARGIN_SECONDS = 60


@dataclass(frozen=True)
class Waiting:
    """The most decisive reason the job's workers wait, and every pod it applies to."""

    reason: str
    message: str
    pods: tuple[str, ...]
    # What `pods` names: worker pods, or the objects an earlier job left.
    noun: str = "worker pod"

    def text(self) -> str:
        return f"{self.noun}{'s' if len(self.pods) > 1 else ''} {', '.join(self.pods)}: {self.message}"


def stuck_terminating(pod: Mapping[str, Any], now: datetime) -> bool:
    """Terminating past the end of its grace (its deletionTimestamp) plus the margin: not going away on its own,
    so it no longer holds its worker's place (backends/elastic/replacement.py: its replacement takes another
    name)."""
    deleted = (pod.get("metadata") or {}).get("deletionTimestamp")
    return bool(deleted) and now - parse_time(deleted) >= timedelta(seconds=TERMINATING_MARGIN_SECONDS)


def earlier_job(leftovers: Iterable[Mapping[str, Any]]) -> Optional[Waiting]:
    """Children of an earlier job of this name (another owner uid) still there: nothing of this job is created
    until the garbage collector removed them, so its pods never mount the old trainer.yaml nor meet the old
    workers at the old rendezvous."""
    named = sorted(f"{o.get('kind', '')} {(o.get('metadata') or {}).get('name', '')}" for o in leftovers)
    if not named:
        return None
    return Waiting(EARLIER_JOB, "left by an earlier job of this name; it starts once the garbage collector "
                   "removed them", tuple(named), noun="object")


def pod_waiting(pod: Mapping[str, Any], now: datetime) -> Optional[tuple[str, str]]:
    """(reason, message) of one worker pod that waits for something it may never get, else None."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName") or "no node"
    deleted = meta.get("deletionTimestamp")
    if deleted:
        if not stuck_terminating(pod, now):
            return None
        # Times, not durations, in messages: a message that changes every pass would be an event every pass.
        return STUCK_TERMINATING, (
            f"Terminating on node {node} past its grace period, which ended {deleted} (is the node lost?); a "
            f"replacement pod takes its place; {_remedy(meta)}"
        )
    if status.get("phase") not in (None, "Pending") or gated_by_kueue(pod):
        return None
    for container in [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason, message = waiting.get("reason"), waiting.get("message") or ""
        if reason and reason not in STARTING:
            image = container.get("image")
            if "Image" in reason and image and image not in message:
                message = f'image "{image}": {message}' if message else f'image "{image}"'
            return reason, message or reason
    scheduled = _condition(status, "PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False" and scheduled.get("reason") == UNSCHEDULABLE:
        return UNSCHEDULABLE, scheduled.get("message") or "no node fits the pod"
    since = scheduled.get("lastTransitionTime") if scheduled is not None and scheduled.get("status") == "True" else None
    if since and now - parse_time(since) >= timedelta(seconds=CONTAINER_CREATING_SECONDS):
        return CONTAINER_CREATING, (
            f"still ContainerCreating on node {node}, scheduled at {since}: a volume that does not attach or mount (FailedAttachVolume, FailedMount) is in "
            f"kubectl describe pod {meta.get('name', '')}"
        )
    return None


def _remedy(meta: Mapping[str, Any]) -> str:
    """How a stuck pod goes. A force delete removes a pod no finalizer holds; Kueue's holds its pods until it counts
    them gone, which the operator sees to (backends/lost_pods.py: marked Failed), and it lets go once the replacement exists.
    The node's out-of-service taint makes PodGC remove it either way."""
    name = meta.get("name", "")
    taint = "or taint the node node.kubernetes.io/out-of-service"
    if KUEUE_POD_FINALIZER in (meta.get("finalizers") or ()):
        return (f"the operator marks it Failed so Kueue counts it gone and lets it go (its {KUEUE_POD_FINALIZER} "
                f"finalizer) once the replacement exists; then kubectl delete pod {name} --force removes it, {taint}")
    return f"to remove it: kubectl delete pod {name} --force, {taint}"


def waiting(pods: Iterable[Mapping[str, Any]], now: datetime) -> Optional[Waiting]:
    """The most decisive wait among the pods, naming each pod that has it (the first pod's message)."""
    found = {}
    for pod in pods:
        why = pod_waiting(pod, now)
        if why is not None:
            found[(pod.get("metadata") or {}).get("name", "")] = why
    if not found:
        return None
    reason = min((r for r, _ in found.values()), key=_rank)
    names = tuple(sorted(name for name, (r, _) in found.items() if r == reason))
    return Waiting(reason, found[names[0]][1], names)


def _rank(reason: str) -> int:
    return PRIORITY.index(reason) if reason in PRIORITY else PRIORITY.index(UNSCHEDULABLE)


def _condition(status: Mapping[str, Any], kind: str) -> Optional[Mapping[str, Any]]:
    return next((c for c in status.get("conditions") or () if c.get("type") == kind), None)
