"""The pytorchjob backend: the equivalent Kubeflow `kubeflow.org/v1` PyTorchJob, plus our ConfigMap and PVC.

Pure. The Kubeflow training operator creates the pods and sets torchrun's
rendezvous variables itself, so the container carries only the NCCL block.
A fixed-size job is Master (rank-0 node) + Workers; an elastic job is
Workers only with an `elasticPolicy`, as Kubeflow runs elastic jobs (its
rendezvous endpoint is worker 0, and the range counts Worker replicas).
"""

from __future__ import annotations

from typing import Any

from ...objects.names import SUSPEND_ANNOTATION
from ...spec import Job, is_elastic, node_range
from ...spec.owned import PYTORCHJOB_CONTAINER
from ..shared.common import (
    build_checkpoint_claim,
    build_config_map,
    job_labels,
    metadata,
    pod_annotations,
    pod_spec,
    workload_labels,
)
from ..shared.network import build_network_policy
from ..shared.overlay import with_labels
from ..shared.workers import rendezvous_timeouts, trainer_container

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
CONTAINER_NAME = PYTORCHJOB_CONTAINER
# The label the training operator puts on each pod it makes for a PyTorchJob, the job's name as its value
# (kubeflow/common pkg/apis/common/v1/constants.go JobNameLabel; kubeflow-training's constants.JOB_NAME_LABEL).
# Its pods carry our job labels too (the template's), so the operator's pod watch already sees them.
KUBEFLOW_JOB_NAME_LABEL = "training.kubeflow.org/job-name"
# The training operator restarts failed pods in place and counts them against runPolicy.backoffLimit.
RESTART_POLICY = "OnFailure"


def _replica(job: Job, replicas: int) -> dict[str, Any]:
    template_meta = {"labels": with_labels(job, job_labels(job)), "annotations": pod_annotations(job)}
    return {
        "replicas": replicas,
        "restartPolicy": RESTART_POLICY,
        "template": {"metadata": template_meta, "spec": pod_spec(job, CONTAINER_NAME, trainer_container(job), RESTART_POLICY)},
    }


def _run_policy(job: Job) -> dict[str, Any]:
    policy = job.spec.run_policy
    out: dict[str, Any] = {"backoffLimit": policy.backoff_limit, "suspend": policy.suspend}
    if policy.active_deadline_seconds is not None:
        out["activeDeadlineSeconds"] = policy.active_deadline_seconds
    if policy.ttl_seconds_after_finished is not None:
        out["ttlSecondsAfterFinished"] = policy.ttl_seconds_after_finished
    sched = job.spec.scheduling
    scheduling = {}
    # Kubeflow hands this queue to its gang scheduler (Volcano); a Kueue queue is the queue-name label.
    if sched.volcano_queue:
        scheduling["queue"] = sched.volcano_queue
    if sched.priority_class_name:
        scheduling["priorityClass"] = sched.priority_class_name
    if scheduling:
        out["schedulingPolicy"] = scheduling
    return out


def build_pytorchjob(job: Job) -> dict[str, Any]:
    """The PyTorchJob; its SUSPEND_ANNOTATION records the BrainTrainingJob's suspend it was last given
    (reconcile applies that flag, or under Kueue the Workload's spec.active, only when it changes)."""
    spec = job.spec
    body: dict[str, Any] = {"nprocPerNode": str(spec.nproc_per_node), "runPolicy": _run_policy(job)}
    if is_elastic(spec):
        low, high = node_range(spec)
        body["elasticPolicy"] = {
            "minReplicas": low,
            "maxReplicas": high,
            "rdzvBackend": "c10d",
            "maxRestarts": spec.elastic.max_restarts,
            # Kubeflow passes these to torchrun as PET_RDZV_CONF (shared/workers.py says why they are long).
            "rdzvConf": [{"key": key, "value": value} for key, value in rendezvous_timeouts(job).items()],
        }
        body["pytorchReplicaSpecs"] = {"Worker": _replica(job, spec.nodes)}
    else:
        replicas = {"Master": _replica(job, 1)}
        if spec.nodes > 1:
            replicas["Worker"] = _replica(job, spec.nodes - 1)
        body["pytorchReplicaSpecs"] = replicas
    # Under Kueue the job's suspend reaches Kueue's Workload, which Kueue creates active, once it exists.
    annotations = {SUSPEND_ANNOTATION: str(spec.run_policy.suspend and not spec.scheduling.queue_name).lower()}
    meta = metadata(job, job.name, workload_labels(job), annotations)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": body}


def render_pytorchjob(job: Job) -> list[dict[str, Any]]:
    """ConfigMap, PVC (when templated), the NetworkPolicy (Kubeflow's pods carry the template's job labels) and
    the PyTorchJob."""
    extras = [build_checkpoint_claim(job), build_network_policy(job)]
    return [build_config_map(job), *filter(None, extras), build_pytorchjob(job)]
