"""What a deleted job leaves to do (pure): the Events naming the checkpoint claim that outlives it, and the Kueue
Workload to delete so that Kueue lets its pods, and the group's quota, go."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ..objects.refs import ObjectRef
from ..spec import OperatorDefaults, job_or_none
from ..spec.model import RETAIN
from ..status.events import NORMAL, Event
from . import kueue
from .shared.workers import checkpoint_claim_name


def deletion_events(manifest: Mapping[str, Any], defaults: Optional[OperatorDefaults] = None) -> list[Event]:
    """Events for a deleted job: the checkpoint claim that outlives it, and how to resume from it or free it."""
    job = job_or_none(manifest, defaults)
    if job is None:
        return []  # an invalid job made no claim
    claim, ckpt = checkpoint_claim_name(job), job.spec.checkpoint
    if claim is None or (ckpt.claim_name is None and ckpt.reclaim_policy != RETAIN):
        return []
    how = (
        f"a new job named {job.name} resumes from its newest checkpoint (so does any job naming it in "
        f"spec.checkpoint.claimName); kubectl delete pvc {claim} -n {job.namespace} frees it"
    )
    return [Event(NORMAL, "CheckpointClaimKept", f"checkpoint claim {claim} is kept after the job: {how}")]


def deletion_deletes(manifest: Mapping[str, Any], defaults: Optional[OperatorDefaults] = None) -> list[ObjectRef]:
    """What to delete for a deleted job: a queued elastic job's Kueue Workload. The garbage collector deletes its
    pods, but Kueue's finalizer would keep them, and the group's quota, for good; a deleted Workload makes Kueue
    stop and finalize every pod of the group (pod_controller.go Stop, StopReasonWorkloadDeleted)."""
    job = job_or_none(manifest, defaults)
    if job is None or job.spec.backend != "elastic" or not job.spec.scheduling.queue_name:
        return []
    return [kueue.group_workload(job)]
