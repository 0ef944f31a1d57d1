"""How the operator names a job's children, and the labels that find them.

Pure. Pods are `<job>-worker-<i>` and the headless Service `<job>-workers`,
so `<job>-worker-<i>.<job>-workers` resolves to pod i (docs/architecture.md).
A replacement pod whose name is still held (a lost node's pod, Terminating
for good) is `<job>-worker-<i>-<attempt>` with the same hostname and
subdomain, so the DNS name stays `<job>-worker-<i>.<job>-workers`
(backends/elastic/replacement.py holds the rule).
"""

from __future__ import annotations

import hashlib
from typing import Mapping

from .resource import GROUP

JOB_NAME_LABEL = f"{GROUP}/job-name"
REPLICA_INDEX_LABEL = f"{GROUP}/replica-index"
# On worker pods (and PyTorchJob pod templates): the digest of the trainer.yaml they were made with.
CONFIG_HASH_ANNOTATION = f"{GROUP}/config-hash"
# On a BrainTrainingJob, set by its user: a new value asks the workers for a checkpoint (docs/operator.md).
CHECKPOINT_NOW_ANNOTATION = f"{GROUP}/checkpoint-now"
# On a BrainTrainingJob, set by its user: a new value "<steps> [anything]" asks the workers for a profile.
PROFILE_NOW_ANNOTATION = f"{GROUP}/profile-now"
# On a PyTorchJob: the BrainTrainingJob's runPolicy.suspend last applied to it.
SUSPEND_ANNOTATION = f"{GROUP}/suspend"
MANAGED_BY = {"app.kubernetes.io/name": "brain-train", "app.kubernetes.io/managed-by": "brain-operator"}


# Pod names are DNS subdomains, but a replacement's name stays a DNS label like its hostname (what kubectl,
# Kueue and log tooling expect of a pod name).
POD_NAME_MAX = 63
# Characters of the job name's digest that keep a shortened replacement name apart from another job's.
NAME_DIGEST = 5


def worker_pod_name(job_name: str, index: int, attempt: int = 0) -> str:
    """Pod i's name; `attempt` n > 0 names its replacement while `<job>-worker-<i>` is still held.

    A replacement name too long for a DNS label keeps the start of the job
    name and a digest of all of it, so two long job names sharing a prefix
    still name different pods. The first name is the hostname as well, which
    the job's validation keeps within a DNS label.
    """
    if not attempt:
        return f"{job_name}-worker-{index}"  # also the hostname: spec/parse.py keeps it a DNS label
    suffix = f"-worker-{index}-{attempt}"
    if len(job_name) + len(suffix) <= POD_NAME_MAX:
        return f"{job_name}{suffix}"
    digest = hashlib.sha256(job_name.encode()).hexdigest()[:NAME_DIGEST]
    head = job_name[:POD_NAME_MAX - len(suffix) - NAME_DIGEST - 1].rstrip("-")
    return f"{head}-{digest}{suffix}"


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
