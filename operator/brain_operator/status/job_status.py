"""A BrainTrainingJob's `status` as typed dataclasses.

The CRD's status schema is generated from these classes, `compute.py` builds
them, and `to_dict` serialises them once, in camelCase. `status.progress` is
the trainer's own progress document (brain_trainer.contract.Progress).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from brain_trainer.contract import Goodput, Progress
from brain_trainer.schema import ConfigError, from_dict, setting, to_dict, valid_fields

PENDING, RUNNING, RESTARTING = "Pending", "Running", "Restarting"
SUCCEEDED, FAILED, SUSPENDED = "Succeeded", "Failed", "Suspended"
# Waiting for Kueue to admit the job (its reason in the condition).
QUEUED = "Queued"
PHASES = (PENDING, QUEUED, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED)
TERMINAL = (SUCCEEDED, FAILED)
VALID = "Valid"
# One condition per phase a user may wait on (`kubectl wait --for=condition=Succeeded`), plus Valid.
CONDITION_TYPES = (VALID, PENDING, QUEUED, RUNNING, RESTARTING, SUSPENDED, SUCCEEDED, FAILED)
# Not a phase: a Running job that reports no progress (stalled.py).
STALLED = "Stalled"
# Not a phase: the API server refused to create a child (a worker pod, mostly), with its message (reconcile.py).
CREATE_REFUSED = "CreateRefused"
# Not a phase: whether every desired worker pod is ready, else why not, naming the pods (waiting.py).
WORKERS_READY = "WorkersReady"
CONDITION_STATUSES = ("True", "False", "Unknown")


@dataclass
class Condition:
    """One condition of the job (Valid, a phase's, WorkersReady, Stalled, CreateRefused)."""

    type: str = setting(choices=(*CONDITION_TYPES, WORKERS_READY, STALLED, CREATE_REFUSED))
    status: str = setting(choices=CONDITION_STATUSES)
    reason: Optional[str] = setting(None)
    message: Optional[str] = setting(None)
    last_transition_time: Optional[str] = setting(None)


@dataclass
class WorkerCounts:
    """Worker pods by state."""

    desired: int = setting(0, minimum=0)
    ready: int = setting(0, minimum=0)
    running: int = setting(0, minimum=0)
    succeeded: int = setting(0, minimum=0)
    failed: int = setting(0, minimum=0)


@dataclass
class LastCheckpoint:
    """The newest committed checkpoint."""

    step: int = setting(minimum=0)
    path: str = setting()


@dataclass
class Incident:
    """The latest worker failure charged as one incident, with the failures it caused (incidents.py)."""

    reason: str = setting(help="the root cause's reason (out-of-memory, preempted, ...)")
    pod: str = setting(help="the worker pod whose failure started it")
    since: str = setting(help="when that pod ended: a pod created before it was in the group it broke")
    step: Optional[int] = setting(None, minimum=0, help="rank 0's step when it was charged: progress past it ends it")


@dataclass
class JobStatus:
    """Observed state of a BrainTrainingJob, written by the operator."""

    phase: Optional[str] = setting(None, choices=PHASES)
    conditions: list[Condition] = field(default_factory=list)
    workers: Optional[WorkerCounts] = None
    nodes: Optional[str] = setting(None, help="ready/desired workers, for the Nodes column")
    selector: Optional[str] = setting(None, help="label selector of the worker pods (scale subresource)")
    restarts: int = setting(0, minimum=0, help="incidents counted against runPolicy.backoffLimit (one per failure that "
                            "broke the worker group, whatever it took down with it); never decreases")
    in_pod_restarts: int = setting(
        0, minimum=0, help="worker-group restarts torchrun made inside rank 0's pod (elastic.maxRestarts), from rank 0's "
        "progress document; never decreases"
    )
    container_restarts: Optional[int] = setting(
        None, minimum=0, help="PyTorchJob backend: the restartCount of the trainer containers of Kubeflow's pods, "
        "summed, as last seen (restartPolicy OnFailure restarts them in place, and Kubeflow counts them against its "
        "backoffLimit); each rise is counted in restarts"
    )
    last_in_pod_restart: Optional[str] = setting(
        None, help="why the latest in-pod restart happened, as the failed attempt's trainer named it"
    )
    reason: Optional[str] = setting(
        None, help="why the latest worker failure happened, as the trainer named it (storage-full, out-of-memory, ...), "
        "FailedCreate when the API server refused a child, or why worker pods wait while they do (Unschedulable, "
        "ImagePullBackOff, CreateContainerConfigError, ...: the WorkersReady condition names the pods)"
    )
    handled_failures: Optional[list[str]] = setting(
        None, help="uids of the failed worker pods already counted (or retried free), while those pods exist"
    )
    incident: Optional[Incident] = setting(
        None, help="the latest incident: later exits of the pods it broke are its consequences, not counted again"
    )
    strategy: Optional[str] = setting(None, help="the parallelism strategy as resolved")
    effective_batch_size: Optional[int] = setting(None, minimum=1, help="sequences per optimizer step")
    progress: Optional[Progress] = setting(None, help="rank 0's latest progress document, as the operator last saw it change")
    last_checkpoint: Optional[LastCheckpoint] = None
    goodput: Optional[Goodput] = setting(None, help="where the job's wall time went, from rank 0's progress document")
    start_time: Optional[str] = setting(None)
    completion_time: Optional[str] = setting(None)
    observed_generation: Optional[int] = setting(None)

    @classmethod
    def read(cls, status: Any) -> "JobStatus":
        """A status as the API server holds it; a field this version cannot read is left out, not fatal."""
        if isinstance(status, cls):
            return status
        try:
            return from_dict(cls, status, camel_case=True)
        except ConfigError:
            return from_dict(cls, valid_fields(cls, status, camel_case=True), camel_case=True)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self, camel_case=True)

    def condition(self, kind: str) -> Optional[Condition]:
        """The condition of type `kind` when it is "True"."""
        return next((c for c in self.conditions if c.type == kind and c.status == "True"), None)

    def find(self, kind: str) -> Optional[Condition]:
        """The condition of type `kind`, whatever its status."""
        return next((c for c in self.conditions if c.type == kind), None)


def read_status(manifest: Mapping[str, Any]) -> JobStatus:
    return JobStatus.read(manifest.get("status") or {})
