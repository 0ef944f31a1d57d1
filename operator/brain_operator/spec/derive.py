"""What follows from a parsed job: its size, its collective backend, its strategy, its trainer.yaml (pure).

Status shows these values and the renderers use them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from brain_trainer.config import TrainerConfig
from brain_trainer.contract import METRICS_PORT
from brain_trainer.plan import resolve_distributed
from brain_trainer.schema import to_dict

from .model import Job, JobSpec

# Rank 0's endpoint in a pod: the operator polls it by pod IP; the job's NetworkPolicy limits who else may connect.
ALL_INTERFACES = "0.0.0.0"


def node_range(spec: JobSpec) -> tuple[int, int]:
    """(min, max) nodes for torchrun's --nnodes; an unset bound is `nodes`."""
    return spec.node_range()


def is_elastic(spec: JobSpec) -> bool:
    low, high = spec.node_range()
    return low < high


def world_size(spec: JobSpec) -> int:
    return spec.nodes * spec.nproc_per_node


def uses_gpus(spec: JobSpec) -> bool:
    return spec.resources.gpus() > 0


def resolved_backend(spec: JobSpec) -> str:
    """The collective backend: nccl when the pods request GPUs and backend is auto."""
    return spec.distributed.resolved_backend(uses_gpus(spec))


def resolved_strategy(spec: JobSpec) -> str:
    """The strategy status reports, as the trainer will resolve it.

    `auto` on multi-rank GPU pods stays `auto`: the trainer plans against the
    real device memory at start-up, which the operator cannot see.
    """
    if spec.distributed.strategy == "auto" and uses_gpus(spec) and world_size(spec) > 1:
        return "auto"
    return resolve_distributed(_sections(spec).resolved(), world_size(spec), None).strategy


def effective_batch_size(job: Job) -> int:
    """Sequences per optimizer step at the job's current size."""
    return _sections(job.spec).effective_batch_size(world_size(job.spec))


def trainer_config(
    job: Job, *, checkpoint_dir: Optional[str] = None, metrics_port: int = METRICS_PORT, metrics_address: str = ALL_INTERFACES
) -> TrainerConfig:
    """The trainer.yaml the workers read: the spec's trainer sections as written, plus what the operator derives.

    Derived: the checkpoint folder (checkpoint.uri, else the volume's mount
    path; the local runner gives its own folder for a volume), rank 0's metrics port and address (every interface
    of a pod; the local runner's loopback), and the node count.
    """
    return _sections(job.spec, checkpoint_dir=checkpoint_dir, metrics_port=metrics_port, metrics_address=metrics_address)


def _sections(
    spec: JobSpec, *, checkpoint_dir: Optional[str] = None, metrics_port: int = METRICS_PORT,
    metrics_address: str = ALL_INTERFACES,
) -> TrainerConfig:
    return TrainerConfig(
        model=spec.model,
        training=spec.training,
        distributed=replace(spec.distributed, num_nodes=spec.nodes),
        data=spec.data.trainer_config(),
        watchdog=spec.watchdog,
        checkpoint=spec.checkpoint.trainer_config(checkpoint_dir or spec.checkpoint.location()),
        metrics=replace(spec.metrics, port=metrics_port, bind_address=metrics_address),
        profiling=spec.profiling,
    )


def spec_to_dict(spec: JobSpec) -> dict:
    """The spec as camelCase YAML-ready data (the inverse of parsing)."""
    return to_dict(spec, camel_case=True)
