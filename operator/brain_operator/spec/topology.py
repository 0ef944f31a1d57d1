"""Where spec.scheduling.topology cannot be honoured (pure): refused with the field named.

Kueue's Topology Aware Scheduling places a workload it admits, so the job
needs a queue. The placement is only worth its name when consecutive ranks
share the lowest level (NCCL's rings and trees run rank to rank), which the
elastic backend's pods ensure (topology.py). The pytorchjob backend cannot:
Kueue places Kubeflow's Master and Worker replicas as separate pod sets
(kueue pkg/controller/jobs/kubeflow/kubeflowjob, PodSets: one per replica
type, its index label training.kubeflow.org/replica-index), while torchrun
ranks the pods by host name; so it is refused there rather than half done.
"""

from __future__ import annotations

from typing import Any, Iterator

from brain_trainer.schema import Names


def topology_problems(spec: Any, name: Names) -> Iterator[tuple[str, str]]:
    """(field, message) for a topology the job's queue or backend cannot honour."""
    if spec.scheduling.topology is None:
        return
    if not spec.scheduling.queue_name:
        yield ("scheduling.topology", "Kueue's Topology Aware Scheduling places queued workers only: set "
               f"{name('scheduling.queue_name')}")
    if spec.backend != "elastic":
        yield ("scheduling.topology", f"applies to the elastic backend, got {spec.backend}: Kueue places Kubeflow's "
               "Master and Worker replicas as separate pod sets, so consecutive ranks need not share a domain")
