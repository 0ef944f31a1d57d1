"""Pieces both backends render identically: names, labels, the ConfigMap, the checkpoint PVC, the worker pod spec.

Pure: a parsed Job in, plain manifest dicts out.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping, Optional

from brain_trainer.config import METRICS_PORT

from ..spec import API_VERSION, GROUP, KIND, Job, trainer_config

CONFIG_DIR = "/etc/brain"
CONFIG_FILE = "trainer.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
# torchrun reads its settings from PET_* variables; the trainer from the ConfigMap.
COMMAND = ["torchrun"]
ARGS = ["-m", "brain_trainer", "--config", CONFIG_PATH]

JOB_NAME_LABEL = f"{GROUP}/job-name"
REPLICA_INDEX_LABEL = f"{GROUP}/replica-index"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MANAGED_BY = {"app.kubernetes.io/name": "brain-train", "app.kubernetes.io/managed-by": "brain-operator"}

# Non-root numeric IDs, so runAsNonRoot is verifiable without inspecting the image.
RUN_AS_USER = 1000
# SIGTERM makes the trainer commit a checkpoint before exiting; a 7B sharded save needs minutes.
TERMINATION_GRACE_SECONDS = 300
# torchrun forwards SIGTERM to its workers and SIGKILLs them after this long (its
# default, 30 s, is too short for a save); the margin lets torchrun itself exit.
SHUTDOWN_TIMEOUT_SECONDS = TERMINATION_GRACE_SECONDS - 30

CONFIG_VOLUME = "config"
SHM_VOLUME = "dshm"
CHECKPOINT_VOLUME = "checkpoints"


def workers_service_name(job: Job) -> str:
    return f"{job.name}-workers"


def worker_pod_name(job: Job, index: int) -> str:
    return f"{job.name}-worker-{index}"


def config_map_name(job: Job) -> str:
    return f"{job.name}-config"


def checkpoint_claim_name(job: Job) -> Optional[str]:
    """The PVC mounted for checkpoints: the user's, the rendered one, or None (pod-local scratch)."""
    ckpt = job.spec.checkpoint
    if ckpt.claim_name is not None:
        return ckpt.claim_name
    if ckpt.volume_claim_template is not None:
        return f"{job.name}-checkpoints"
    return None


def selector_labels(job: Job) -> dict[str, str]:
    """Labels that select every child of the job (the reconciler lists children with these)."""
    return {JOB_NAME_LABEL: job.name}


def label_selector(labels: Mapping[str, str]) -> str:
    """Equality-based label selector text: `k1=v1,k2=v2`."""
    return ",".join(f"{k}={v}" for k, v in labels.items())


def selector(job: Job) -> str:
    """`selector_labels` as a label-selector string (status.selector, for the scale subresource)."""
    return label_selector(selector_labels(job))


def job_labels(job: Job) -> dict[str, str]:
    return {**MANAGED_BY, **selector_labels(job)}


def workload_labels(job: Job) -> dict[str, str]:
    """Labels of what Kueue admits (the pods, or the PyTorchJob): the job's plus its queue."""
    labels = job_labels(job)
    if job.spec.scheduling.queue_name:
        labels[QUEUE_LABEL] = job.spec.scheduling.queue_name
    return labels


def owner_references(job: Job) -> list[dict[str, Any]]:
    """The job owns its children (garbage collection); none without a uid (local runs, dry runs)."""
    if not job.uid:
        return []
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": job.name,
            "uid": job.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def metadata(
    job: Job, name: str, labels: Optional[dict[str, str]] = None, annotations: Optional[dict[str, str]] = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": job.namespace, "labels": labels or job_labels(job)}
    if annotations:
        meta["annotations"] = annotations
    owners = owner_references(job)
    if owners:
        meta["ownerReferences"] = owners
    return meta


def build_config_map(job: Job) -> dict[str, Any]:
    """`<name>-config` holding trainer.yaml, the resolved TrainerConfig."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(job, config_map_name(job)),
        "data": {CONFIG_FILE: trainer_config(job).to_yaml()},
    }


def build_checkpoint_claim(job: Job) -> Optional[dict[str, Any]]:
    """`<name>-checkpoints` from volumeClaimTemplate; None when the job names an existing claim or has none."""
    template = job.spec.checkpoint.volume_claim_template
    if template is None:
        return None
    spec: dict[str, Any] = {
        "accessModes": list(template.access_modes),
        "resources": {"requests": {"storage": template.storage}},
    }
    if template.storage_class_name is not None:
        spec["storageClassName"] = template.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(job, checkpoint_claim_name(job)),
        "spec": spec,
    }


def nccl_env(job: Job) -> list[dict[str, str]]:
    """The NCCL block: typed fields first, then the user's extra keys (reserved keys were refused at parse time)."""
    nccl = job.spec.nccl
    env = []
    if nccl.debug is not None:
        env.append({"name": "NCCL_DEBUG", "value": nccl.debug})
    if nccl.socket_ifname is not None:
        env.append({"name": "NCCL_SOCKET_IFNAME", "value": nccl.socket_ifname})
    if nccl.ib_disable is not None:
        env.append({"name": "NCCL_IB_DISABLE", "value": "1" if nccl.ib_disable else "0"})
    env.extend({"name": k, "value": v} for k, v in sorted(nccl.env.items()))
    return env


def pod_annotations() -> dict[str, str]:
    """Prometheus scrape annotations for rank 0's endpoint (the trainer's default port; the spec keeps it)."""
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT), "prometheus.io/path": "/metrics"}


def container(job: Job, name: str, env: list[dict[str, str]], ports: list[dict[str, Any]]) -> dict[str, Any]:
    """The trainer container: exec-form torchrun, least privilege, config/shm/checkpoint mounts."""
    spec = job.spec
    ports = [*ports, {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}]
    out: dict[str, Any] = {
        "name": name,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(COMMAND),
        "args": list(ARGS),
        "env": [*env, *nccl_env(job), {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": ports,
        "volumeMounts": [
            {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
            {"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.mount_path},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    resources = {k: dict(v) for k, v in (("requests", spec.resources.requests), ("limits", spec.resources.limits)) if v}
    if resources:
        out["resources"] = resources
    return out


def volumes(job: Job) -> list[dict[str, Any]]:
    claim = checkpoint_claim_name(job)
    checkpoint = {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
    return [
        {"name": CONFIG_VOLUME, "configMap": {"name": config_map_name(job)}},
        # NCCL and DataLoader workers share memory through /dev/shm; the runtime's default is 64 MiB.
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
        {"name": CHECKPOINT_VOLUME, **checkpoint},
    ]


def pod_spec(
    job: Job, container_name: str, env: list[dict[str, str]], restart_policy: str, ports: Optional[list[dict[str, Any]]] = None
) -> dict[str, Any]:
    """A worker's pod spec: restricted security, no API token, scheduling fields, a grace period to checkpoint."""
    sched = job.spec.scheduling
    spec: dict[str, Any] = {
        "restartPolicy": restart_policy,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container(job, container_name, env, ports or [])],
        "volumes": volumes(job),
    }
    if sched.node_selector:
        spec["nodeSelector"] = dict(sched.node_selector)
    if sched.tolerations:
        spec["tolerations"] = copy.deepcopy(sched.tolerations)
    if sched.affinity:
        spec["affinity"] = copy.deepcopy(sched.affinity)
    if sched.priority_class_name:
        spec["priorityClassName"] = sched.priority_class_name
    if sched.scheduler_name:
        spec["schedulerName"] = sched.scheduler_name
    return spec
