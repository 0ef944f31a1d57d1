"""Pieces both backends render identically: labels, metadata, the ConfigMap, the checkpoint PVC, the worker pod spec.

Pure: a parsed Job (and its typed worker plan, workers.py) in, plain manifest dicts out.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any, Optional

from brain_trainer.contract import CHECKPOINT_REQUEST_FILE, CONFIG_FILE, METRICS_PATH, METRICS_PORT, PROFILE_REQUEST_FILE

from ...sizing.grace import termination_grace_seconds
from ...objects.names import CONFIG_HASH_ANNOTATION, JOB_NAME_LABEL, MANAGED_BY, config_map_name, label_selector
from ...objects.schedulers import QUEUE_LABEL
from ...spec import API_VERSION, KIND, Job, trainer_config
from ...spec.model import DELETE
from .overlay import apply_overlay, with_annotations
from .workers import (
    CLAIM,
    CONFIG_MAP,
    MEMORY,
    OVERLAY,
    Container,
    Volume,
    checkpoint_claim_name,
)

# Non-root numeric IDs, so runAsNonRoot is verifiable without inspecting the image.
RUN_AS_USER = 1000


def selector_labels(job: Job) -> dict[str, str]:
    """Labels that select every child of the job (the reconciler lists children with these)."""
    return {JOB_NAME_LABEL: job.name}


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
    job: Job,
    name: str,
    labels: Optional[dict[str, str]] = None,
    annotations: Optional[dict[str, str]] = None,
    *,
    owned: bool = True,
) -> dict[str, Any]:
    """A child's metadata; `owned=False` leaves out the owner reference, so the child outlives the job."""
    meta: dict[str, Any] = {"name": name, "namespace": job.namespace, "labels": labels or job_labels(job)}
    if annotations:
        meta["annotations"] = annotations
    owners = owner_references(job) if owned else []
    if owners:
        meta["ownerReferences"] = owners
    return meta


def config_text(job: Job) -> str:
    """trainer.yaml as the ConfigMap holds it."""
    return trainer_config(job).to_yaml()


def config_hash(text: str) -> str:
    """The digest pods carry in CONFIG_HASH_ANNOTATION: which trainer.yaml they were made with."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_config_map(job: Job) -> dict[str, Any]:
    """`<name>-config` holding trainer.yaml: the spec's trainer sections plus what the operator derives.

    With the job's checkpoint-now annotation, also CHECKPOINT_REQUEST_FILE: the kubelet updates it in
    the mounted volume, and a new value makes the workers commit a checkpoint (docs/operator.md). With its
    profile-now annotation, PROFILE_REQUEST_FILE the same way: a new value makes them profile some steps.
    """
    data = {CONFIG_FILE: config_text(job)}
    if job.checkpoint_request:
        data[CHECKPOINT_REQUEST_FILE] = job.checkpoint_request
    if job.profile_request:
        data[PROFILE_REQUEST_FILE] = job.profile_request
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(job, config_map_name(job.name)),
        "data": data,
    }


def build_checkpoint_claim(job: Job) -> Optional[dict[str, Any]]:
    """`<name>-checkpoints` from volumeClaimTemplate; None when the job names an existing claim or has none.

    Labelled with the job's name; owned by the job (so deleted with it) only under `reclaimPolicy: Delete`.
    """
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
        "metadata": metadata(job, checkpoint_claim_name(job), owned=job.spec.checkpoint.reclaim_policy == DELETE),
        "spec": spec,
    }


def pod_annotations(job: Job) -> dict[str, str]:
    """The overlay's annotations, Prometheus scrape annotations for rank 0's endpoint, and the trainer.yaml digest."""
    return with_annotations(
        job,
        {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(METRICS_PORT),
            "prometheus.io/path": METRICS_PATH,
            CONFIG_HASH_ANNOTATION: config_hash(config_text(job)),
        },
    )


def container(job: Job, name: str, planned: Container) -> dict[str, Any]:
    """The trainer container: the planned command, env (and envFrom), mounts and ports, with least privilege."""
    spec = job.spec
    out: dict[str, Any] = {
        "name": name,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(planned.command),
        "args": list(planned.args),
        "env": [{"name": k, "value": v} for k, v in planned.env],
        "ports": [{"name": p.name, "containerPort": p.number, "protocol": "TCP"} for p in planned.ports],
        "volumeMounts": [
            {"name": v.name, "mountPath": v.mount_path, **({"readOnly": True} if v.read_only else {})}
            for v in planned.volumes
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if planned.secrets:
        out["envFrom"] = [{"secretRef": {"name": secret}} for secret in planned.secrets]
    resources = {k: dict(v) for k, v in (("requests", spec.resources.requests), ("limits", spec.resources.limits)) if v}
    if resources:
        out["resources"] = resources
    return out


def _volume_source(volume: Volume) -> dict[str, Any]:
    if volume.kind == CONFIG_MAP:
        return {"configMap": {"name": volume.source}}
    if volume.kind == CLAIM:
        return {"persistentVolumeClaim": {"claimName": volume.source, **({"readOnly": True} if volume.read_only else {})}}
    if volume.kind == MEMORY:
        return {"emptyDir": {"medium": "Memory"}}
    return {"emptyDir": {}}


def pod_spec(job: Job, container_name: str, planned: Container, restart_policy: str) -> dict[str, Any]:
    """A worker's pod spec: restricted security, no API token, scheduling fields, a grace period to checkpoint,
    then the job's pod overlay."""
    sched = job.spec.scheduling
    spec: dict[str, Any] = {
        "restartPolicy": restart_policy,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": termination_grace_seconds(job),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container(job, container_name, planned)],
        # The overlay's volumes come with the overlay (apply_overlay); the plan only mounts them.
        "volumes": [{"name": v.name, **_volume_source(v)} for v in planned.volumes if v.kind != OVERLAY],
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
    return apply_overlay(job, spec, container_name)
