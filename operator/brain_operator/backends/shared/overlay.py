"""The pod overlay (`spec.podTemplate`) merged into a rendered worker pod (pure).

The parser already refused whatever the operator owns (spec/overlay.py), so
merging by name, Kubernetes style, means adding: the overlay's volumes,
init containers and sidecars after the operator's, its env and mounts after
the trainer's own. Sidecars and init containers get the restricted profile's
container settings unless they say otherwise, and the trainer's capabilities
stay `drop: [ALL]` plus exactly what the overlay adds.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from ...spec import Job

# With the host's network a pod resolves cluster names (the rendezvous host) only with this policy.
HOST_NETWORK_DNS = "ClusterFirstWithHostNet"
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def with_labels(job: Job, labels: Mapping[str, str]) -> dict[str, str]:
    """The operator's pod labels and the overlay's (which never name the same key)."""
    return {**job.spec.pod_template.metadata.labels, **labels}


def with_annotations(job: Job, annotations: Mapping[str, str]) -> dict[str, str]:
    return {**job.spec.pod_template.metadata.annotations, **annotations}


def _restricted(container: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(container))
    context = out.get("securityContext") or {}
    capabilities = {**RESTRICTED_CONTAINER["capabilities"], **(context.get("capabilities") or {})}
    out["securityContext"] = {**RESTRICTED_CONTAINER, **context, "capabilities": capabilities}
    return out


def _add_to_trainer(trainer: dict[str, Any], entry: Mapping[str, Any]) -> None:
    for key in ("env", "envFrom", "volumeMounts"):
        if entry.get(key):
            trainer[key] = [*trainer.get(key, []), *copy.deepcopy(entry[key])]
    added = ((entry.get("securityContext") or {}).get("capabilities") or {}).get("add")
    if added:
        trainer["securityContext"]["capabilities"]["add"] = list(added)


def apply_overlay(job: Job, spec: dict[str, Any], trainer_name: str) -> dict[str, Any]:
    """`spec` (a rendered pod spec whose trainer container is `trainer_name`) with the job's overlay merged in."""
    overlay = job.spec.pod_template.spec
    if overlay.image_pull_secrets:
        spec["imagePullSecrets"] = copy.deepcopy(overlay.image_pull_secrets)
    if overlay.service_account_name is not None:
        spec["serviceAccountName"] = overlay.service_account_name
    if overlay.automount_service_account_token is not None:
        spec["automountServiceAccountToken"] = overlay.automount_service_account_token
    if overlay.volumes:
        spec["volumes"] = [*spec.get("volumes", []), *copy.deepcopy(overlay.volumes)]
    if overlay.init_containers:
        spec["initContainers"] = [_restricted(c) for c in overlay.init_containers]
    trainer = next(c for c in spec["containers"] if c["name"] == trainer_name)
    _add_to_trainer(trainer, overlay.trainer())
    spec["containers"].extend(_restricted(c) for c in overlay.sidecars())
    for key, value in (
        ("priorityClassName", overlay.priority_class_name),
        ("hostNetwork", overlay.host_network),
        ("dnsPolicy", overlay.dns_policy or (HOST_NETWORK_DNS if overlay.host_network else None)),
        ("runtimeClassName", overlay.runtime_class_name),
    ):
        if value is not None:
            spec[key] = value
    return spec

