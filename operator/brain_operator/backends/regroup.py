"""A resized Kueue pod group: no pod of the new size while the old group's Workload exists (pure).

Kueue fixes a pod group's size at admission, so a resize ends the group
(reconcile deletes its Workload, named after the job) and every worker comes
back in a group of the new size. While the old Workload exists, Kueue still
holds the group by its name: a pod of the new size created then is one of
that group, and Kueue deletes it, as the Workload's Stop deletes every pod
of the group (kueue pkg/controller/jobframework/reconciler.go, "The workload
is marked for deletion"; pod_controller.go Stop) or as an excess pod
(FindMatchingWorkloads). So the pass that ends the group creates no pod,
and later passes create the new group's pods only once the old Workload is
gone, as the Job controller holds its creates until it has observed the
deletions it made (pkg/controller/job/job_controller.go, expectations).

To know, the operator reads the Workload (kueue.workloads) while
the job has a pod of another group size, or no pod at all.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..objects.refs import ObjectRef
from ..objects.schedulers import POD_GROUP_COUNT_ANNOTATION, WORKLOAD
from ..spec import Job


def _group_size(obj: Mapping[str, Any]) -> str:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(POD_GROUP_COUNT_ANNOTATION, "")


def in_transition(job: Job, pods: Iterable[Mapping[str, Any]]) -> bool:
    """A queued elastic job whose group may be changing: a pod of another group size than the spec's, or none."""
    sizes = {_group_size(pod) for pod in pods}
    return bool(job.spec.scheduling.queue_name) and job.spec.backend == "elastic" and (
        not sizes or sizes != {str(job.spec.nodes)})


def old_group_stays(job: Job, existing: Mapping[ObjectRef, Mapping[str, Any]], deletes: Iterable[ObjectRef]) -> bool:
    """Whether the job's old Kueue pod group still holds its name: its Workload deleted this pass, or there, of
    another size than the spec's, or marked for deletion."""
    ref = ObjectRef(*WORKLOAD, job.namespace, job.name)
    if not job.spec.scheduling.queue_name or job.spec.backend != "elastic":
        return False
    if ref in deletes:
        return True
    workload = existing.get(ref)
    if workload is None:
        return False
    counts = {str(p.get("count")) for p in (workload.get("spec") or {}).get("podSets") or ()}
    return bool((workload.get("metadata") or {}).get("deletionTimestamp")) or (
        bool(counts) and counts != {str(job.spec.nodes)})
