"""Kueue, the operator's part (pure but for `workloads`, which lists them): reading Kueue's Workloads, handing the
job's suspend to a queued PyTorchJob's Workload, and ending a plain pod group.

Kueue queues a job by its `spec.scheduling.queueName` (objects/schedulers.py holds the labels, annotations and
kinds it reads, each from the upstream source). The elastic backend's pods form a plain pod group whose Workload
is named after the job; the PyTorchJob backend's Workload carries the PyTorchJob's uid.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence

from ..cluster.api import ClusterClient
from ..objects.names import SUSPEND_ANNOTATION
from ..objects.pods import PodView, pod_view
from ..objects.refs import ObjectRef
from ..objects.schedulers import (JOB_UID_LABEL, KUEUE_POD_FINALIZER, POD_GROUP_COUNT_ANNOTATION, POD_GROUP_LABEL,
                                  RETRIABLE_IN_GROUP_ANNOTATION, WORKLOAD, pending_reason)
from ..spec import Job
from .regroup import in_transition
from .writes import POD, PYTORCHJOB, annotations_of, kind_of


def workloads(job: Job, children: Sequence[Mapping[str, Any]], client: ClusterClient) -> list[dict]:
    """Kueue's Workloads for a job it holds back (none otherwise: a running job costs no call).

    A plain pod group's Workload is named after the group (the job), and is
    read also while the group may be changing (regroup.in_transition); a
    PyTorchJob's carries the PyTorchJob's uid in JOB_UID_LABEL, and is read
    also while the job's suspend is not yet applied to it (`activation`).
    """
    if not job.spec.scheduling.queue_name:
        return []
    if job.spec.backend == "elastic":
        pods = [c for c in children if kind_of(c) == POD]
        if not all_gated(pod_view(c) for c in pods) and not in_transition(job, pods):
            return []
        return client.list_objects(*WORKLOAD, job.namespace, field_selector=f"metadata.name={job.name}")
    noted = str(job.spec.run_policy.suspend).lower()
    held = [c for c in children if kind_of(c) == PYTORCHJOB
            and (holds(job, c) or annotations_of(c).get(SUSPEND_ANNOTATION) != noted)]
    return [
        workload
        for pytorchjob in held
        for workload in client.list_objects(
            *WORKLOAD, job.namespace,
            label_selector=f"{JOB_UID_LABEL}={(pytorchjob.get('metadata') or {}).get('uid', '')}",
        )
    ]


def group_workload(job: Job) -> ObjectRef:
    """Kueue's Workload of the job's plain pod group, named after the group (the job; pod_controller.go
    workloadName)."""
    return ObjectRef(*WORKLOAD, job.namespace, job.name)


def unretriable(job: Job, existing: Mapping[ObjectRef, Mapping[str, Any]]) -> list[tuple[ObjectRef, dict]]:
    """A failed job's pod group ends: each of its pods annotated retriable-in-group "false", so Kueue finishes
    the group once none runs, releasing its quota and every pod's finalizer (pod_controller.go Finished; the
    job reconciler's finalizeJob). The failed pods stay for their logs."""
    return [(ref, {"metadata": {"annotations": {RETRIABLE_IN_GROUP_ANNOTATION: "false"}}})
            for ref, obj in existing.items() if (ref.api_version, ref.kind) == POD
            and ((obj.get("metadata") or {}).get("labels") or {}).get(POD_GROUP_LABEL) == job.name
            and KUEUE_POD_FINALIZER in ((obj.get("metadata") or {}).get("finalizers") or ())
            and annotations_of(obj).get(RETRIABLE_IN_GROUP_ANNOTATION) != "false"]


def activation(job: Job, current: Mapping[str, Any],
               existing: Mapping[ObjectRef, Mapping[str, Any]]) -> list[tuple[ObjectRef, dict]]:
    """The job's suspend, applied to a queued PyTorchJob through Kueue's Workload when it changes.

    Kueue un-suspends an admitted job that is suspended (kueue
    pkg/controller/jobframework/reconciler.go, "Job admitted, unsuspending"),
    so suspending means deactivating its Workload (`spec.active: false`:
    Kueue evicts it, suspends the PyTorchJob and frees its quota); resuming
    reactivates it, and Kueue queues it again. SUSPEND_ANNOTATION on the
    PyTorchJob records the suspend last applied, so a Workload that Kueue
    itself deactivated is never reactivated by us; with no Workload yet,
    the next pass tries again.
    """
    noted = str(job.spec.run_policy.suspend).lower()
    if annotations_of(current).get(SUSPEND_ANNOTATION) == noted:
        return []
    uid = (current.get("metadata") or {}).get("uid")
    found = [ref for ref, obj in existing.items() if (ref.api_version, ref.kind) == WORKLOAD
             and ((obj.get("metadata") or {}).get("labels") or {}).get(JOB_UID_LABEL) == uid]
    if not found:
        return []
    active = {"spec": {"active": not job.spec.run_policy.suspend}}
    return [*((ref, active) for ref in found),
            (ObjectRef.of(current), {"metadata": {"annotations": {SUSPEND_ANNOTATION: noted}}})]


def all_gated(pods: Iterable[PodView]) -> bool:
    """Kueue holds the whole group back (after a preemption too); one gated replacement pod is a restart."""
    waiting = [p for p in pods if not p.finished]
    return bool(waiting) and all(p.gated for p in waiting)


def group_size(pod: Mapping[str, Any]) -> Optional[str]:
    return annotations_of(pod).get(POD_GROUP_COUNT_ANNOTATION)


def holds(job: Job, pytorchjob: Mapping[str, Any]) -> bool:
    """A PyTorchJob suspended while its BrainTrainingJob is not: Kueue has not admitted it."""
    suspended = (pytorchjob.get("spec", {}).get("runPolicy") or {}).get("suspend", False)
    return bool(job.spec.scheduling.queue_name) and suspended and not job.spec.run_policy.suspend


def reason(job: Job, existing: Mapping[ObjectRef, Mapping[str, Any]]) -> tuple[str, str]:
    """Kueue's own reason for holding the job back, from its Workload; a plain one until Kueue has written it."""
    found = [obj for ref, obj in existing.items() if (ref.api_version, ref.kind) == WORKLOAD]
    return pending_reason(found) or (
        "WaitingForAdmission",
        f"waiting for Kueue to admit the job in queue {job.spec.scheduling.queue_name}",
    )


