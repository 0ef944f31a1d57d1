"""Pure renderers: a parsed BrainTrainingJob in, the Kubernetes objects it needs out.

    workers     the typed worker plan (also what the local runner starts)
    common      labels, metadata, ConfigMap, checkpoint PVC, the pod spec
    overlay     the job's pod overlay (spec.podTemplate) merged into each worker pod
    gangs       the PodGroup of a gang-scheduled elastic job, and each pod's link to it
    network     the NetworkPolicy: who may connect to the job's pods
    elastic     the default backend: headless Service + one pod per node
    pytorchjob  the Kubeflow backend
"""

from __future__ import annotations

from typing import Any

from ..objects.names import JOB_NAME_LABEL, REPLICA_INDEX_LABEL
from ..spec import Job
from ..objects.schedulers import QUEUE_LABEL
from .shared.common import build_checkpoint_claim, build_config_map, config_hash, selector, selector_labels
from .elastic.render import build_service, build_worker_pod, render_elastic
from .shared.gangs import build_pod_group
from .pytorchjob.render import KUBEFLOW_JOB_NAME_LABEL, build_pytorchjob, render_pytorchjob
from .shared.workers import CONFIG_PATH, checkpoint_claim_name, elastic_worker, elastic_workers

_RENDERERS = {"elastic": render_elastic, "pytorchjob": render_pytorchjob}


def render(job: Job) -> list[dict[str, Any]]:
    """Every desired child object of the job, for its backend."""
    return _RENDERERS[job.spec.backend](job)


__all__ = [
    "KUBEFLOW_JOB_NAME_LABEL",
    "CONFIG_PATH",
    "JOB_NAME_LABEL",
    "QUEUE_LABEL",
    "REPLICA_INDEX_LABEL",
    "render",
    "render_elastic",
    "render_pytorchjob",
    "build_service",
    "build_worker_pod",
    "build_config_map",
    "build_checkpoint_claim",
    "build_pod_group",
    "config_hash",
    "build_pytorchjob",
    "checkpoint_claim_name",
    "elastic_worker",
    "elastic_workers",
    "selector",
    "selector_labels",
]
