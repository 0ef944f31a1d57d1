"""A lost node's pod and its replacement: the whole rule (pure).

A worker's place (its replica index) is held by its pod until that pod is gone. Two kinds of pod never go on
their own, so they give up the place while keeping their name:

- a pod on a lost node: deleted, Terminating for good, since the kubelet that would confirm its end is gone
  (Kubernetes frees it only once the Node is removed or tainted out-of-service). Past its grace plus a margin
  (status/waiting.py stuck_terminating, which also says so in the status's WorkersReady condition) it is `stuck`;
- an ended pod Kueue's finalizer keeps until a replacement exists (objects.schedulers.held_by_kueue): `kept`.
  A kept pod that is also Terminating is stuck too.

The replacement is then created under the first free `<job>-worker-<i>-<attempt>`
(objects.names.worker_pod_name) with the same hostname and subdomain, so the worker's DNS name and the rendezvous
endpoint stay put. The cluster client never adopts a Terminating pod of the name it creates
(cluster.client.already_exists): the next pass plans again.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Collection, Mapping, Optional

from ...objects.names import worker_pod_name
from ...objects.pods import PodView
from ...objects.refs import ObjectRef
from ...objects.schedulers import held_by_kueue
from ...spec import Job
from ...status.waiting import stuck_terminating


def kept_pods(existing: Mapping[ObjectRef, Mapping[str, Any]], pods: Collection[ObjectRef]) -> set[ObjectRef]:
    """Ended pods Kueue's finalizer keeps until a replacement exists: they hold their names, not their places."""
    return {ref for ref in pods if held_by_kueue(existing[ref])}


def stuck_pods(existing: Mapping[ObjectRef, Mapping[str, Any]], pods: Mapping[ObjectRef, PodView],
               kept: Collection[ObjectRef], now: datetime) -> set[ObjectRef]:
    """Pods that will not go away: Terminating past their grace (a lost node's), or kept by Kueue and Terminating."""
    return {ref for ref in pods if stuck_terminating(existing[ref], now) or (ref in kept and pods[ref].terminating)}


def places_held(pods: Mapping[ObjectRef, PodView], failed: Collection[ObjectRef],
                stuck: Collection[ObjectRef]) -> set[Optional[int]]:
    """The replica indexes whose pod still holds the place after this pass: not failed, not stuck."""
    return {p.index for ref, p in pods.items() if ref not in failed and ref not in stuck}


def names_taken(pods: Collection[ObjectRef], failed: Collection[ObjectRef], kept: Collection[ObjectRef]) -> set[str]:
    """Names that stay taken after this pass's deletions: a failed pod goes at once (it has nothing to stop),
    unless Kueue's finalizer keeps it."""
    return {ref.name for ref in pods if ref not in failed or ref in kept}


def replacement(job: Job, pod: Mapping[str, Any], index: Optional[int], taken: Collection[str]) -> dict[str, Any]:
    """Worker `index`'s pod under its own name, or, while a pod that will not go away (a lost node's) holds that
    name, under the first free `<job>-worker-<i>-<attempt>`: the same hostname and subdomain, so its DNS name and
    the rendezvous endpoint stay put."""
    name = pod["metadata"]["name"]
    attempt = 0
    while name in taken:
        attempt += 1
        name = worker_pod_name(job.name, index or 0, attempt)
    return {**pod, "metadata": {**pod["metadata"], "name": name}}
