"""The elastic backend (DESIGN.md §4): operator-managed pods running torchrun with c10d rendezvous on pod 0.

Pure. `render_elastic` gives every desired object; the reconciler also calls
the single-object builders to recreate one failed pod or to scale.
"""

from __future__ import annotations

from typing import Any

from ..spec import Job, node_range
from .common import (
    REPLICA_INDEX_LABEL,
    SHUTDOWN_TIMEOUT_SECONDS,
    build_checkpoint_claim,
    build_config_map,
    metadata,
    pod_annotations,
    pod_spec,
    selector_labels,
    worker_pod_name,
    workers_service_name,
    workload_labels,
)

CONTAINER_NAME = "trainer"
RDZV_PORT = 29400
# The operator, not the kubelet, replaces failed pods: it counts them against runPolicy.backoffLimit.
RESTART_POLICY = "Never"
KUEUE_POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_POD_GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"


def rendezvous_endpoint(job: Job) -> str:
    return f"{worker_pod_name(job, 0)}.{workers_service_name(job)}:{RDZV_PORT}"


def torchrun_env(job: Job, index: int) -> list[dict[str, str]]:
    """torchrun's PET_* settings; pod 0 hosts the c10d store, said explicitly rather than by hostname matching."""
    spec = job.spec
    low, high = node_range(spec)
    return [
        {"name": "PET_NNODES", "value": f"{low}:{high}"},
        {"name": "PET_NPROC_PER_NODE", "value": str(spec.nproc_per_node)},
        {"name": "PET_RDZV_BACKEND", "value": "c10d"},
        {"name": "PET_RDZV_ENDPOINT", "value": rendezvous_endpoint(job)},
        {"name": "PET_RDZV_ID", "value": job.uid or job.name},
        {"name": "PET_MAX_RESTARTS", "value": str(spec.elastic.max_restarts)},
        {"name": "PET_RDZV_CONF", "value": f"is_host={1 if index == 0 else 0}"},
        {"name": "PET_SHUTDOWN_TIMEOUT", "value": str(SHUTDOWN_TIMEOUT_SECONDS)},
        # A restarted worker group must not read the dead group's gloo/NCCL addresses
        # from a store it shares with torchrun (pytorch/pytorch#135712).
        {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"},
    ]


def build_service(job: Job) -> dict[str, Any]:
    """Headless `<name>-workers`: pod DNS names resolve before readiness, so no init container waits on DNS."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(job, workers_service_name(job)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(job),
            "ports": [{"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT, "protocol": "TCP"}],
        },
    }


def build_worker_pod(job: Job, index: int) -> dict[str, Any]:
    """Worker pod `<name>-worker-<index>`."""
    labels = {**workload_labels(job), REPLICA_INDEX_LABEL: str(index)}
    annotations = pod_annotations()
    if job.spec.scheduling.queue_name:
        # Kueue admits the workers as one gang.
        labels[KUEUE_POD_GROUP_LABEL] = job.name
        annotations[KUEUE_POD_GROUP_COUNT] = str(job.spec.nodes)
    name = worker_pod_name(job, index)
    ports = [{"name": "rdzv", "containerPort": RDZV_PORT, "protocol": "TCP"}]
    spec = pod_spec(job, CONTAINER_NAME, torchrun_env(job, index), RESTART_POLICY, ports)
    spec["hostname"] = name
    spec["subdomain"] = workers_service_name(job)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata(job, name, labels, annotations), "spec": spec}


def render_elastic(job: Job) -> list[dict[str, Any]]:
    """Service, ConfigMap, PVC (when templated) and one pod per node."""
    claim = build_checkpoint_claim(job)
    objects = [build_service(job), build_config_map(job), *([claim] if claim else [])]
    objects.extend(build_worker_pod(job, i) for i in range(job.spec.nodes))
    return objects
