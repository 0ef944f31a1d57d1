"""What one pass plans (pure): the writes (`Plan`), what it plans them from (`Seen`), and the pieces both
backends' planners share: the children that are not pods, and the ConfigMap's patch."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping, Optional, Sequence

from ..objects.refs import ObjectRef
from ..spec import Job
from ..status.events import Event
from ..status.job_status import JobStatus
from ..status.waiting import Waiting
from .lost_pods import PodStatusPatch

POD = ("v1", "Pod")
CONFIG_MAP = ("v1", "ConfigMap")
PYTORCHJOB = ("kubeflow.org/v1", "PyTorchJob")


@dataclass(frozen=True)
class Plan:
    """The writes one reconcile makes, and the status they lead to."""

    status: JobStatus
    creates: tuple[dict, ...] = ()
    deletes: tuple[ObjectRef, ...] = ()
    patches: tuple[tuple[ObjectRef, dict], ...] = ()
    events: tuple[Event, ...] = ()
    pod_statuses: tuple[PodStatusPatch, ...] = ()  # made first: backends/lost_pods.py


@dataclass(frozen=True)
class Seen:
    """What a backend's planner plans from: the job, its rendered objects, its children by reference, the status
    before this pass, and `now`; `leftovers` says why an earlier job's children hold it back (None when none do)."""

    job: Job
    desired: Sequence[Mapping[str, Any]]
    existing: Mapping[ObjectRef, Mapping[str, Any]]
    before: JobStatus
    now: datetime
    leftovers: Optional[Waiting] = None


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def kind_of(obj: Mapping[str, Any]) -> tuple[str, str]:
    return obj["apiVersion"], obj["kind"]


def config_patches(desired: Sequence[Mapping[str, Any]], existing: Mapping[ObjectRef, Mapping[str, Any]]) -> list:
    """trainer.yaml changed by a propagated field (docs/operator.md, "Changing a running job"): patch the ConfigMap."""
    patches = []
    for obj in desired:
        current = existing.get(ObjectRef.of(obj)) if kind_of(obj) == CONFIG_MAP else None
        if current is not None and current.get("data") != obj["data"]:
            # A merge patch removes a key (a checkpoint request whose annotation went) only when it says null.
            gone = {key: None for key in current.get("data") or {} if key not in obj["data"]}
            patches.append((ObjectRef.of(obj), {"data": {**obj["data"], **gone}}))
    return patches


def missing_others(desired: Sequence[Mapping[str, Any]], existing: Mapping[ObjectRef, Any]) -> list[dict]:
    return [dict(o) for o in desired if (o["apiVersion"], o["kind"]) != POD and ObjectRef.of(o) not in existing]


