"""The elastic backend (docs/architecture.md): operator-managed pods running torchrun with c10d rendezvous on pod 0.

Pure. `render_elastic` gives every desired object; the reconciler also calls
the single-object builders to recreate one failed pod or to scale.
"""

from __future__ import annotations

from typing import Any

from ...objects.names import REPLICA_INDEX_LABEL, workers_service_name
from ...objects.schedulers import POD_GROUP_COUNT_ANNOTATION, POD_GROUP_LABEL
from ...spec import Job
from ...spec.owned import TRAINER_CONTAINER
from ..shared.common import (
    build_checkpoint_claim,
    build_config_map,
    metadata,
    pod_annotations,
    pod_spec,
    selector_labels,
    workload_labels,
)
from ..shared.gangs import build_pod_group, join_pod_group
from ..shared.network import build_network_policy
from ..shared.overlay import with_labels
from ..shared.workers import RDZV_PORT, RDZV_PORT_NAME, elastic_worker
from .topology import placement

CONTAINER_NAME = TRAINER_CONTAINER
# The operator, not the kubelet, replaces failed pods: it counts them against runPolicy.backoffLimit.
RESTART_POLICY = "Never"


def build_service(job: Job) -> dict[str, Any]:
    """Headless `<name>-workers`: pod DNS names resolve before readiness, so no init container waits on DNS."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(job, workers_service_name(job.name)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(job),
            "ports": [{"name": RDZV_PORT_NAME, "port": RDZV_PORT, "targetPort": RDZV_PORT, "protocol": "TCP"}],
        },
    }


def build_worker_pod(job: Job, index: int) -> dict[str, Any]:
    """Worker pod `<name>-worker-<index>`, from the worker plan.

    With a Kueue queue the workers form one plain pod group (named after the
    job, sized spec.nodes) that Kueue admits at once; its webhook gates each
    pod and Kueue ungates them, so a replacement pod rejoins the group as is.
    """
    worker = elastic_worker(job, index)
    labels = with_labels(job, {**workload_labels(job), REPLICA_INDEX_LABEL: str(index)})
    annotations = pod_annotations(job)
    if job.spec.scheduling.queue_name:
        labels[POD_GROUP_LABEL] = job.name
        annotations[POD_GROUP_COUNT_ANNOTATION] = str(job.spec.nodes)
        placed_labels, placed_annotations = placement(job, index)
        labels.update(placed_labels)
        annotations.update(placed_annotations)
    spec = pod_spec(job, CONTAINER_NAME, worker.container, RESTART_POLICY)
    spec["hostname"] = worker.name
    spec["subdomain"] = workers_service_name(job.name)
    join_pod_group(job, labels, annotations, spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata(job, worker.name, labels, annotations), "spec": spec}


def render_elastic(job: Job) -> list[dict[str, Any]]:
    """Service, ConfigMap, PVC (when templated), the PodGroup (gang scheduling), the NetworkPolicy and one pod per
    node."""
    extras = [build_checkpoint_claim(job), build_pod_group(job), build_network_policy(job)]
    objects = [build_service(job), build_config_map(job), *filter(None, extras)]
    objects.extend(build_worker_pod(job, i) for i in range(job.spec.nodes))
    return objects
