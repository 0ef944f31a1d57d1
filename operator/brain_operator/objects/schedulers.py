"""What Kueue and the gang schedulers read from our objects: their labels, annotations, kinds and conditions.

Pure constants and readers, each taken from the upstream source (docs/operator.md, "Kueue and gang scheduling"):

- Kueue, plain pod groups: kubernetes-sigs/kueue pkg/controller/jobs/pod/constants/constants.go
  and site/content/en/docs/tasks/run/plain_pods.md; Workload conditions and the job-uid label:
  apis/kueue/v1beta2/workload_types.go, pkg/controller/constants;
- Kubernetes' own PodGroup: kubernetes/api scheduling/v1alpha2/types.go (pods name it in
  spec.schedulingGroup.podGroupName);
- scheduler-plugins' coscheduling: kubernetes-sigs/scheduler-plugins apis/scheduling/v1alpha1/types.go,
  manifests/coscheduling/crd.yaml, the second-scheduler chart's default scheduler name;
- Volcano: volcano-sh/volcano config/crd/volcano/bases/scheduling.volcano.sh_podgroups.yaml and
  the pod annotation KubeGroupNameAnnotationKey of its scheduling/v1beta1 API.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

# ---- Kueue ----
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
# Kueue's webhook adds this gate to the pods it queues and removes it on admission; never we.
ADMISSION_GATE = "kueue.x-k8s.io/admission"
# Kueue labels the Workload it makes for a job (a PyTorchJob) with that job's uid; a
# plain pod group's Workload is named after the group instead.
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
WORKLOAD = ("kueue.x-k8s.io/v1beta2", "Workload")
# Kueue's webhook puts this finalizer on every pod it queues; Kueue removes it from a failed pod only once a
# replacement pod exists, or from every pod of a group that finished or whose Workload was deleted
# (pkg/controller/jobs/pod/constants/constants.go PodFinalizer; pod_controller.go FindMatchingWorkloads, Stop).
KUEUE_POD_FINALIZER = "kueue.x-k8s.io/managed"
# The condition Kueue puts on each pod it stops when it evicts or preempts the pod's Workload, before it deletes the
# pod (pod_controller.go Stop, ConditionTypeTerminationTarget): a disruption, as Kubernetes' DisruptionTarget is.
TERMINATION_TARGET = "TerminationTarget"
# A pod group finishes, releasing its quota and its pods' finalizers, once no pod of it is active and one carries
# this annotation "false" (pod_controller.go Finished, isUnretriableGroup; constants.go RetriableInGroupAnnotation).
RETRIABLE_IN_GROUP_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
QUOTA_RESERVED = "QuotaReserved"
KUEUE_PREFIX = "kueue.x-k8s.io/"

# ---- gang scheduling: scheduling.gang ----
GANG_NONE, GANG_NATIVE, GANG_COSCHEDULING, GANG_VOLCANO = "none", "native", "coscheduling", "volcano"
GANG_MODES = (GANG_NONE, GANG_NATIVE, GANG_COSCHEDULING, GANG_VOLCANO)
# Kubernetes' PodGroup (GenericWorkload feature gate, 1.36): pods point at it from spec.schedulingGroup.
NATIVE_POD_GROUP = ("scheduling.k8s.io/v1alpha2", "PodGroup")
COSCHEDULING_POD_GROUP = ("scheduling.x-k8s.io/v1alpha1", "PodGroup")
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
# The name scheduler-plugins' second-scheduler chart gives its scheduler; spec.scheduling.schedulerName overrides it.
COSCHEDULING_SCHEDULER = "scheduler-plugins-scheduler"
VOLCANO_POD_GROUP = ("scheduling.volcano.sh/v1beta1", "PodGroup")
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_SCHEDULER = "volcano"
POD_GROUP_KINDS = {GANG_NATIVE: NATIVE_POD_GROUP, GANG_COSCHEDULING: COSCHEDULING_POD_GROUP, GANG_VOLCANO: VOLCANO_POD_GROUP}

# Label and annotation prefixes these schedulers own: a job's pod overlay may not set them.
FOREIGN_PREFIXES = (KUEUE_PREFIX, "scheduling.x-k8s.io/", "scheduling.k8s.io/", "scheduling.volcano.sh/", "volcano.sh/")


def gated_by_kueue(pod: Mapping[str, Any]) -> bool:
    """Whether Kueue still holds the pod (its admission gate is on)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == ADMISSION_GATE for g in gates)


def held_by_kueue(pod: Mapping[str, Any]) -> bool:
    """A pod that ended and that Kueue's finalizer keeps until a replacement pod exists or the group ends: it holds
    its name but not its worker's place."""
    finalizers = (pod.get("metadata") or {}).get("finalizers") or ()
    return KUEUE_POD_FINALIZER in finalizers and (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded")


def pending_reason(workloads: Iterable[Mapping[str, Any]]) -> Optional[tuple[str, str]]:
    """(reason, message) of the first Workload that has not reserved quota, as Kueue wrote them."""
    for workload in workloads:
        for condition in (workload.get("status") or {}).get("conditions") or []:
            if condition.get("type") == QUOTA_RESERVED and condition.get("status") != "True":
                return condition.get("reason") or "Pending", condition.get("message") or ""
    return None
