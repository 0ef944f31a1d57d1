"""Gang scheduling for the elastic backend (`spec.scheduling.gang`): the PodGroup and how each pod joins it (pure).

One PodGroup per job, named after it, owned by it, with the elastic minimum
as its minimum: Kubernetes' own (`native`, pods name it in
spec.schedulingGroup), scheduler-plugins' coscheduling (a pod label, its
scheduler) or Volcano's (a pod annotation, its scheduler). The upstream
names are in brain_operator.objects.schedulers.
"""

from __future__ import annotations

from typing import Any, Optional

from ...objects.schedulers import (
    COSCHEDULING_LABEL,
    COSCHEDULING_SCHEDULER,
    GANG_COSCHEDULING,
    GANG_NATIVE,
    GANG_NONE,
    GANG_VOLCANO,
    POD_GROUP_KINDS,
    VOLCANO_GROUP_ANNOTATION,
    VOLCANO_SCHEDULER,
)
from ...spec import Job, node_range
from .common import metadata


def pod_group_name(job: Job) -> str:
    return job.name


def build_pod_group(job: Job) -> Optional[dict[str, Any]]:
    """The job's PodGroup for its gang scheduler; None without one."""
    gang, sched = job.spec.scheduling.gang, job.spec.scheduling
    if gang == GANG_NONE:
        return None
    minimum = node_range(job.spec)[0]
    if gang == GANG_NATIVE:
        spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": minimum}}}
    else:
        spec = {"minMember": minimum}
        if gang == GANG_VOLCANO:
            if sched.volcano_queue:
                spec["queue"] = sched.volcano_queue
            if sched.priority_class_name:
                spec["priorityClassName"] = sched.priority_class_name
    api_version, kind = POD_GROUP_KINDS[gang]
    if gang == GANG_NATIVE:
        api_version = job.native_pod_group
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata(job, pod_group_name(job)), "spec": spec}


def join_pod_group(job: Job, labels: dict[str, str], annotations: dict[str, str], spec: dict[str, Any]) -> None:
    """Link a worker pod to the job's PodGroup, and hand it to that group's scheduler (unless the job names one)."""
    gang, name = job.spec.scheduling.gang, pod_group_name(job)
    if gang == GANG_NATIVE:
        spec["schedulingGroup"] = {"podGroupName": name}
    elif gang == GANG_COSCHEDULING:
        labels[COSCHEDULING_LABEL] = name
        spec.setdefault("schedulerName", COSCHEDULING_SCHEDULER)
    elif gang == GANG_VOLCANO:
        annotations[VOLCANO_GROUP_ANNOTATION] = name
        spec.setdefault("schedulerName", VOLCANO_SCHEDULER)
