"""The elastic backend (docs/architecture.md): operator-managed pods running torchrun with c10d rendezvous on pod 0.

Pure. `render_elastic` gives every desired object; the reconciler also calls
the single-object builders to recreate one failed pod or to scale.
"""

from __future__ import annotations

from typing import Any

from ..names import REPLICA_INDEX_LABEL, workers_service_name
from ..spec import Job
from .common import (
    build_checkpoint_claim,
    build_config_map,
    metadata,
    pod_annotations,
    pod_spec,
    selector_labels,
    workload_labels,
)
from .workers import RDZV_PORT, RDZV_PORT_NAME, elastic_worker

CONTAINER_NAME = "trainer"
# The operator, not the kubelet, replaces failed pods: it counts them against runPolicy.backoffLimit.
RESTART_POLICY = "Never"
KUEUE_POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_POD_GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"


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
    """Worker pod `<name>-worker-<index>`, from the worker plan."""
    worker = elastic_worker(job, index)
    labels = {**workload_labels(job), REPLICA_INDEX_LABEL: str(index)}
    annotations = pod_annotations()
    if job.spec.scheduling.queue_name:
        # Kueue admits the workers as one gang.
        labels[KUEUE_POD_GROUP_LABEL] = job.name
        annotations[KUEUE_POD_GROUP_COUNT] = str(job.spec.nodes)
    spec = pod_spec(job, CONTAINER_NAME, worker.container, RESTART_POLICY)
    spec["hostname"] = worker.name
    spec["subdomain"] = workers_service_name(job.name)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata(job, worker.name, labels, annotations), "spec": spec}


def render_elastic(job: Job) -> list[dict[str, Any]]:
    """Service, ConfigMap, PVC (when templated) and one pod per node."""
    claim = build_checkpoint_claim(job)
    objects = [build_service(job), build_config_map(job), *([claim] if claim else [])]
    objects.extend(build_worker_pod(job, i) for i in range(job.spec.nodes))
    return objects
