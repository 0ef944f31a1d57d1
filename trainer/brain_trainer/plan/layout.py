"""The parallel layout: how the world of ranks splits into pipeline stages, data-parallel replicas and
tensor-parallel groups.

Torch-free, so the operator's validation, `braintrain validate` and the
trainer at start-up refuse the same layouts with the same lines. One value,
built once per run and checked against the world:

    world = pp x dp x tp   pp ranks each run a contiguous run of the model's blocks (stages.py, parallel/pipeline.py);
                           tp ranks split each reasoning/decision block's matmuls (parallel/tensor.py);
                           dp = what is left, sharded or replicated as strategy/fsdpSharding say

Ranks are numbered pp-outermost and tp-innermost (a DeviceMesh is row-major,
dimensions ("pp", dp..., "tp")): the tp ranks of a group are consecutive, so a
group that divides the ranks of a node stays in that node (TP's all-reduces
per block want NVLink, not the network), while a pipeline's stages sit
world / pp ranks apart: only its point-to-point activations cross nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

from ..config import DistributedConfig
from ..config.sections import INTERLEAVED
from ..schema import ConfigError, FieldError, Names

@dataclass(frozen=True)
class Layout:
    """Ranks per parallel dimension, checked: tp divides the ranks of a node, pp x tp the world."""

    world_size: int
    tp: int = 1
    pp: int = 1
    stages_per_rank: int = 1  # pipeline stages each pipeline rank runs (interleaved-1f1b: more than one)

    @property
    def dp(self) -> int:
        """Data-parallel replicas: the ranks that read different batches."""
        return self.world_size // (self.tp * self.pp)

    @property
    def stages(self) -> int:
        """Pipeline stages in all."""
        return self.pp * self.stages_per_rank

    def dp_rank(self, rank: int) -> int:
        """Which batch `rank` reads: the tp ranks of one group, and the stages of one pipeline, read the same one."""
        return rank // self.tp % self.dp

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp

    def pp_rank(self, rank: int) -> int:
        """Which pipeline rank `rank` is: its stages are pp_rank, pp_rank + pp, ... (stages.py)."""
        return rank // (self.tp * self.dp)


def spread_problems(distributed: DistributedConfig, ranks_per_node: int, ranks_per_node_field: str,
                    name: Names) -> Iterator[tuple[str, str]]:
    """What is wrong with spreading `distributed.tensor_parallel` over nodes of `ranks_per_node` ranks each.

    Every world of whole nodes then divides too, so an elastic range keeps the
    layout valid at every size within it."""
    tp = distributed.tp
    if ranks_per_node % tp:
        yield (
            "distributed.tensor_parallel",
            f"{tp} does not divide {name(ranks_per_node_field)} {ranks_per_node} (a tensor-parallel group stays in a node)",
        )


def world_problems(distributed: DistributedConfig, world_size: int, ranks_per_node: int,
                   name: Names) -> Iterator[tuple[str, str]]:
    """What is wrong with `distributed`'s pipeline over a world of `world_size` ranks (tp already divides a node)."""
    tp, pp = distributed.tp, distributed.pp
    if world_size % (tp * pp):
        across = f"{name('distributed.pipeline_parallel')} x {name('distributed.tensor_parallel')} ({pp} x {tp})"
        yield "distributed.pipeline_parallel", f"{across} does not divide the world size {world_size}"
    elif distributed.fsdp_sharding == "hybrid_shard" and pp > 1 and world_size // pp % ranks_per_node:
        yield (
            "distributed.pipeline_parallel",
            f"{pp} stages of {world_size // pp} ranks each split nodes of {ranks_per_node}; hybrid_shard replicates "
            f"across whole nodes: use a node count that is a multiple of {pp}",
        )


def micro_batches_field(global_batch_size: Optional[int]) -> str:
    """The setting that gives the micro-batches per step: the global batch when set, else the accumulation steps."""
    return "training.global_batch_size" if global_batch_size is not None else "distributed.gradient_accumulation_steps"


def micro_batch_problems(distributed: DistributedConfig, micro_batches: int, field: str,
                         name: Names) -> Iterator[tuple[str, str]]:
    """What is wrong with `micro_batches` per step (the accumulation steps, from `field`) for the pipeline."""
    pp = distributed.pp
    if pp == 1:
        return
    if micro_batches < pp:
        yield (
            field,
            f"gives {micro_batches} micro-batches per step, fewer than the {pp} pipeline stages of "
            f"{name('distributed.pipeline_parallel')}: every stage needs one in flight",
        )
    elif distributed.pipeline_schedule == INTERLEAVED and micro_batches % pp:
        yield (
            field,
            f"gives {micro_batches} micro-batches per step; {INTERLEAVED} runs them in rounds of "
            f"{name('distributed.pipeline_parallel')} ({pp}): use a multiple",
        )


def bubble_fraction(distributed: DistributedConfig, micro_batches: int) -> float:
    """The share of a step a pipeline rank idles (fill and drain): (pp - 1) / (v m + pp - 1) for m micro-batches
    and v stages per rank (Narayanan et al. 2021)."""
    pp, v = distributed.pp, distributed.stages_per_rank
    return (pp - 1) / (v * micro_batches + pp - 1)


def build_layout(distributed: DistributedConfig, world_size: int, local_world_size: int) -> Layout:
    """The layout of this run's world; ConfigError naming the field when it cannot be built."""
    problems = list(spread_problems(distributed, local_world_size, "LOCAL_WORLD_SIZE", str))
    if not problems:
        problems.extend(world_problems(distributed, world_size, local_world_size, str))
    if problems:
        raise ConfigError([FieldError(path, message) for path, message in problems])
    return Layout(world_size=world_size, tp=distributed.tp, pp=distributed.pp,
                  stages_per_rank=distributed.stages_per_rank)
