"""How the operator names a job's children, and the labels that find them.

Pure. Pods are `<job>-worker-<i>` and the headless Service `<job>-workers`,
so `<job>-worker-<i>.<job>-workers` resolves to pod i (docs/architecture.md).
"""

from __future__ import annotations

from typing import Mapping

from .resource import GROUP

JOB_NAME_LABEL = f"{GROUP}/job-name"
REPLICA_INDEX_LABEL = f"{GROUP}/replica-index"
# On worker pods (and PyTorchJob pod templates): the digest of the trainer.yaml they were made with.
CONFIG_HASH_ANNOTATION = f"{GROUP}/config-hash"
# On a BrainTrainingJob, set by its user: a new value asks the workers for a checkpoint (docs/operator.md).
CHECKPOINT_NOW_ANNOTATION = f"{GROUP}/checkpoint-now"
# On a PyTorchJob: the BrainTrainingJob's runPolicy.suspend last applied to it.
SUSPEND_ANNOTATION = f"{GROUP}/suspend"
MANAGED_BY = {"app.kubernetes.io/name": "brain-train", "app.kubernetes.io/managed-by": "brain-operator"}


def worker_pod_name(job_name: str, index: int) -> str:
    return f"{job_name}-worker-{index}"


def workers_service_name(job_name: str) -> str:
    return f"{job_name}-workers"


def config_map_name(job_name: str) -> str:
    return f"{job_name}-config"


def network_policy_name(job_name: str) -> str:
    return f"{job_name}-network"


def template_claim_name(job_name: str) -> str:
    """The checkpoint claim the operator makes from `checkpoint.volumeClaimTemplate`."""
    return f"{job_name}-checkpoints"


def label_selector(labels: Mapping[str, str]) -> str:
    """Equality-based label selector text: `k1=v1,k2=v2`."""
    return ",".join(f"{k}={v}" for k, v in labels.items())
