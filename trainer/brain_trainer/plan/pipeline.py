"""What a pipeline rank holds and keeps in flight, for the memory planner (torch-free).

A pipeline rank runs the stages `stage_plan` gives it (stage s on rank s mod
pp); each stage is a contiguous run of the model's units in forward order, so
a rank holds a few index ranges of the chain (`rank_units`).

Micro-batches in flight: a stage keeps the activations of every micro-batch
it has run forward and not yet backward. With m micro-batches per step, pp
pipeline ranks and v stages per rank, on pipeline rank r (`in_flight`):

    gpipe             m                       all forwards, then all backwards
    1f1b              min(m, pp - r)          pp - 1 - r warm-up forwards, then one forward, one backward
    interleaved-1f1b  min(m v, w_r + 1)       stage-micro-batches over its v stages, w_r = min((v - 1) k +
                                              2 (pp - 1 - r), m v) warm-up forwards, k = m // max(1, m // pp)
                                              micro-batches a round (forwards cycle the stages k at a time)

the peak count of forwards not yet backwarded in torch 2.13's schedules
(torch/distributed/pipelining/schedules.py: ScheduleGPipe and Schedule1F1B's
`_get_pipeline_order`; ScheduleInterleaved1F1B's `_get_warmup_ops` with
multiply_factor 2, then its steady phase runs one forward before each
backward). A test counts them in the schedules' own action orders.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ..config import DistributedConfig
from ..config.presets import BrainAIConfig, split_block_params
from ..config.sections import INTERLEAVED
from .layout import micro_batch_problems
from .stages import stage_plan


@dataclass(frozen=True)
class RankStage:
    """One stage a pipeline rank runs: its units (indices into the chain) and where it sits in the pipeline."""

    index: int  # the stage's place in the pipeline, 0 .. pp x v - 1
    units: range  # indices of its units in forward order (stages.pipeline_units)
    names: tuple[str, ...]
    first: bool  # the pipeline's first stage: its input is the batch, nothing is received
    last: bool  # the pipeline's last stage: it computes the loss, no gradient is received

    def describe(self, in_flight: int) -> str:
        return f"stage {self.index}: {self.names[0]} .. {self.names[-1]}, {in_flight} micro-batch(es) in flight"


def rank_units(cfg: BrainAIConfig, seq_len: int, pipeline_parallel: int, stages_per_rank: int = 1,
               tensor_parallel: int = 1) -> list[list[RankStage]]:
    """Per pipeline rank, the stages it runs (its local stages, in forward order)."""
    stages = stage_plan(cfg, seq_len, pipeline_parallel, stages_per_rank, tensor_parallel)
    held: list[list[RankStage]] = [[] for _ in range(pipeline_parallel)]
    start = 0
    for stage in stages:
        end = start + len(stage.units)
        held[stage.rank].append(RankStage(stage.index, range(start, end), stage.names, stage.index == 0,
                                          stage.index == len(stages) - 1))
        start = end
    return held


def in_flight(schedule: str, pipeline_parallel: int, stages_per_rank: int, micro_batches: int,
              rank: int) -> tuple[int, ...]:
    """Micro-batches each local stage of pipeline rank `rank` keeps in flight when the rank's count peaks (see the
    module docstring). Interleaved-1f1b runs its forwards in rounds of k micro-batches per local stage, cycling the
    stages, so the peak's stage-micro-batches fall on the stages in that order."""
    pp, v, m = pipeline_parallel, stages_per_rank, micro_batches
    if schedule == "gpipe":
        return (m,)
    if schedule != INTERLEAVED:
        return (min(m, pp - rank),)
    per_round = m // max(1, m // pp)
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), m * v)
    peak = min(m * v, warmup + 1)
    return tuple(sum(1 for k in range(peak) if k // per_round % v == local) for local in range(v))


def receive_buffers(stage: RankStage, micro_batches: int) -> int:
    """Boundary tensors a stage receives per step, in (micro-batch x seq_len x d_model) activations: torch 2.13's
    PipelineStage allocates one receive buffer per micro-batch for its input (all stages but the first,
    `_prepare_forward_infra`) and one for its output's gradient (all but the last, `_setup_backward_recv_info`)."""
    return micro_batches * ((not stage.first) + (not stage.last))


def split_blocks(stages: list[RankStage]) -> dict[str, int]:
    """Blocks tensor parallelism splits among `stages`' units, by stack."""
    return {stack: sum(name.startswith(f"{stack}.") for stage in stages for name in stage.names)
            for stack in split_block_params(BrainAIConfig())}


def pipeline_problems(strategy: str, world_size: int, tensor_parallel: int, pipeline: DistributedConfig,
                      micro_batches: int, units: int) -> Iterator[tuple[str, str]]:
    """What is wrong with planning `pipeline` over `world_size` ranks, `micro_batches` per step, for a model of
    `units` units (the trainer's field names)."""
    pp, stages = pipeline.pp, pipeline.pp * pipeline.stages_per_rank
    if (pipeline.pipeline_parallel or 0) < 1 or pipeline.stages_per_rank < 1:  # .pp reads an unset degree as 1
        yield ("distributed.pipeline_parallel",
               f"needs >= 1 rank and stage per rank, got {pipeline.pipeline_parallel} x {pipeline.stages_per_rank}")
    elif pp > 1 and strategy != "fsdp":
        yield "distributed.pipeline_parallel", f"{pp} needs strategy fsdp, got {strategy}"
    elif world_size % (tensor_parallel * pp):
        yield ("distributed.pipeline_parallel",
               f"{pp} x tensor_parallel {tensor_parallel} does not divide the world size {world_size}")
    elif stages > units:
        yield "distributed.pipeline_parallel", f"{stages} stages, more than the model's {units} blocks"
    else:
        yield from micro_batch_problems(pipeline, micro_batches, "distributed.gradient_accumulation_steps", str)
