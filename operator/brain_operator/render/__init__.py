"""Pure renderers: a parsed BrainTrainingJob in, the Kubernetes objects it needs out."""

from __future__ import annotations

from typing import Any

from ..spec import Job
from .common import (
    CONFIG_PATH,
    JOB_NAME_LABEL,
    QUEUE_LABEL,
    REPLICA_INDEX_LABEL,
    build_checkpoint_claim,
    build_config_map,
    checkpoint_claim_name,
    config_map_name,
    selector,
    selector_labels,
    worker_pod_name,
    workers_service_name,
)
from .elastic import build_service, build_worker_pod, render_elastic
from .pytorchjob import build_pytorchjob, render_pytorchjob

_RENDERERS = {"elastic": render_elastic, "pytorchjob": render_pytorchjob}


def render(job: Job) -> list[dict[str, Any]]:
    """Every desired child object of the job, for its backend."""
    return _RENDERERS[job.spec.backend](job)


__all__ = [
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
    "build_pytorchjob",
    "checkpoint_claim_name",
    "config_map_name",
    "selector",
    "selector_labels",
    "worker_pod_name",
    "workers_service_name",
]
