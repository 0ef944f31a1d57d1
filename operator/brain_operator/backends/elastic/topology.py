"""Topology-aware placement by Kueue, rendered on the elastic backend's worker pods (pure).

Kueue's Topology Aware Scheduling reads two pod annotations (kueue
apis/kueue/v1alpha1 topology_types.go): `podset-required-topology` (every
pod of the group within one domain of the node label, or not admitted) and
`podset-preferred-topology` (one domain if they fit, else as few domains of
the levels above). It assigns the group's pods to domains in the order of
their index (`kueue.x-k8s.io/pod-group-pod-index`, which Kueue's pod webhook
copies from the label that `kueue.x-k8s.io/pod-group-pod-index-label` names:
pod_webhook.go Default), filling the lowest-level domain with consecutive
indices first.

torchrun's c10d rendezvous ranks the nodes by their address, the pod's host
name as text (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py
assigns ranks over the sorted participants, each described by its FQDN), so
`<job>-worker-10` comes before `<job>-worker-2`. The index Kueue places by
is that order (RANK_ORDER_LABEL): consecutive ranks then share the lowest
topology level. A replacement pod keeps its worker's host name, so its
rank's place.
"""

from __future__ import annotations

from typing import Any

from ...objects.names import worker_pod_name
from ...objects.resource import GROUP
from ...spec import Job

REQUIRED_ANNOTATION = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_ANNOTATION = "kueue.x-k8s.io/podset-preferred-topology"
INDEX_LABEL_ANNOTATION = "kueue.x-k8s.io/pod-group-pod-index-label"
# The worker's place in torchrun's rank order (its host name's among the job's), on each worker pod.
RANK_ORDER_LABEL = f"{GROUP}/rank-order"


def rank_order(job_name: str, nodes: int, index: int) -> int:
    """Worker `index`'s position in the text order of the job's worker host names: its node rank."""
    # Sorted as torch sorts them: the FQDN begins `<host name>.` (the subdomain follows).
    names = sorted(f"{worker_pod_name(job_name, i)}." for i in range(nodes))
    return names.index(f"{worker_pod_name(job_name, index)}.")


def placement(job: Job, index: int) -> tuple[dict[str, str], dict[str, Any]]:
    """(labels, annotations) worker `index` adds for spec.scheduling.topology; none without it."""
    topology = job.spec.scheduling.topology
    if topology is None:
        return {}, {}
    level = {REQUIRED_ANNOTATION: topology.required} if topology.required else {PREFERRED_ANNOTATION: topology.preferred}
    return ({RANK_ORDER_LABEL: str(rank_order(job.name, job.spec.nodes, index))},
            {**level, INDEX_LABEL_ANNOTATION: RANK_ORDER_LABEL})
