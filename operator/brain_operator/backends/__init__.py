"""The backends: how a job runs on the cluster, each planned beside its renderer, chosen through one table.

    elastic/     the default backend: headless Service + one pod per node, which the operator plans itself
                 (plan.py; a lost node's pod and its replacement: replacement.py; Kueue's topology: topology.py)
    pytorchjob/  the Kubeflow backend: one PyTorchJob, whose pods the training operator makes
    kueue        what both do with Kueue: its Workloads, a queued PyTorchJob's suspend, a pod group's end
    lost_pods    a queued job's pod lost with its node, marked Failed so Kueue lets its replacement run
    orphans      the Kueue pod groups of a job that is gone, ended
    regroup      a resized Kueue pod group: no pod of the new size while the old group's Workload exists
    kueue_integration  a queued PyTorchJob Kueue does not manage, held suspended
    shared/      what every backend's pods share: the worker plan, the pod spec, overlay, network, gangs
    writes       what a planner plans from (Seen) and the writes it returns (Plan)

A new backend is a folder with a `render(job)` and a `plan(seen)`, and a row of BACKENDS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..objects.names import JOB_NAME_LABEL, REPLICA_INDEX_LABEL
from ..objects.schedulers import QUEUE_LABEL
from ..spec import Job
from .elastic.plan import plan_elastic
from .elastic.render import build_service, build_worker_pod, render_elastic
from .pytorchjob.plan import plan_pytorchjob
from .pytorchjob.render import KUBEFLOW_JOB_NAME_LABEL, build_pytorchjob, render_pytorchjob
from .shared.common import build_checkpoint_claim, build_config_map, config_hash, selector, selector_labels
from .shared.gangs import build_pod_group
from .shared.workers import CONFIG_PATH, checkpoint_claim_name, elastic_worker, elastic_workers
from .writes import Plan, Seen


@dataclass(frozen=True)
class Backend:
    """A backend: the children a job needs (pure), and one pass's writes and status from what exists (pure)."""

    render: Callable[[Job], list[dict[str, Any]]]
    plan: Callable[[Seen], Plan]


# spec.backend -> its backend (spec.model.JOB_BACKENDS names the same, in this order: tests/operator/test_backends.py).
BACKENDS = {"elastic": Backend(render_elastic, plan_elastic), "pytorchjob": Backend(render_pytorchjob, plan_pytorchjob)}


def render(job: Job) -> list[dict[str, Any]]:
    """Every desired child object of the job, for its backend."""
    return BACKENDS[job.spec.backend].render(job)


def plan_backend(seen: Seen) -> Plan:
    """One pass's writes and status for the job's backend."""
    return BACKENDS[seen.job.spec.backend].plan(seen)


__all__ = [
    "BACKENDS",
    "Backend",
    "Plan",
    "Seen",
    "plan_backend",
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
