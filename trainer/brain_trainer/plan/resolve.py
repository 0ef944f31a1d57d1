"""A run's `strategy: auto` made concrete, and the planner's bytes per rank for the strategy it runs (torch-free)."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ..config import DistributedConfig, TrainerConfig
from ..schema import ConfigError
from .choice import StrategyChoice
from .host import plan_host_memory
from .ladder import choose_strategy
from .memory import plan_for
from .question import PlanQuestion, unplanned_strategy


def _picked(dist: DistributedConfig, choice: StrategyChoice, global_batch_set: bool) -> DistributedConfig:
    """`dist` with the planner's `choice`; a degree it picked multiplies the accumulation (global batch unset)."""
    accumulation = dist.gradient_accumulation_steps
    if not global_batch_set:
        accumulation *= (choice.tensor_parallel if dist.tensor_parallel is None else 1) * (
            choice.pipeline_parallel if dist.pipeline_parallel is None else 1)
    return replace(
        dist,
        strategy=choice.strategy,
        fsdp_sharding=choice.fsdp_sharding if choice.strategy == "fsdp" else dist.fsdp_sharding,
        activation_checkpointing=choice.activation_checkpointing,
        cpu_offload=choice.cpu_offload,
        tensor_parallel=choice.tensor_parallel,
        pipeline_parallel=choice.pipeline_parallel,
        gradient_accumulation_steps=accumulation,
    )


def resolve_distributed(cfg: TrainerConfig, world_size: int, device_memory_bytes: Optional[int],
                        ranks_per_node: Optional[int] = None) -> DistributedConfig:
    """cfg.distributed with `strategy: auto` made concrete; other strategies come back unchanged.

    auto starts from the preset's recommendations (`TrainerConfig.resolved`). One rank, unknown device memory (CPU)
    or a user entrypoint (whose size the planner cannot know without torch): `unplanned_strategy`. Otherwise the
    planner's cheapest fit (`choose_strategy`) for the question the config asks (`PlanQuestion.from_config`). A job
    that leaves tensor_parallel and pipeline_parallel unset lets the planner pick the smallest tensor-parallel degree
    that fits in nodes of `ranks_per_node` ranks, then the smallest pipeline (`plan_ladder`); a picked degree above 1
    multiplies gradient_accumulation_steps by it when training.global_batch_size is unset (set, the trainer's
    accumulation grows by it alike), so the global batch stays the one the job names at every layout (what the
    operator reports).
    """
    if cfg.distributed.strategy != "auto":
        return cfg.distributed
    dist = cfg.resolved().distributed
    tp, pp = dist.tp, dist.pp
    if (world_size == 1 and tp == 1 and pp == 1) or device_memory_bytes is None or cfg.model.entrypoint:
        return replace(dist, strategy=unplanned_strategy(world_size, tp, pp), tensor_parallel=tp, pipeline_parallel=pp)
    question = PlanQuestion.from_config(cfg, world_size, device_memory_bytes=device_memory_bytes,
                                        ranks_per_node=ranks_per_node)
    choice, _ = choose_strategy(question)
    return _picked(dist, choice, cfg.training.global_batch_size is not None)


def rank_estimate(cfg: TrainerConfig, dist: DistributedConfig, world_size: int, *, node_size: int,
                  accelerator: bool) -> Optional[int]:
    """The planner's bytes per rank for a run's resolved strategy: device memory on an accelerator, host memory on
    the CPU; None for a user model (its size is unknown here) or settings it cannot plan."""
    if cfg.model.entrypoint:
        return None
    try:
        question = PlanQuestion.from_config(replace(cfg, distributed=dist), world_size, ranks_per_node=node_size)
        plan = plan_for(question, question.choice())
    except ConfigError:
        return None
    return plan.total if accelerator else plan_host_memory(question, plan, accelerator=False).total
