"""What the planner refuses to plan, each refusal naming the trainer's field (torch-free)."""

from __future__ import annotations

from typing import Iterator

from ..config import ACTIVATION_CHECKPOINTING, FSDP_SHARDING, PRECISIONS, DistributedConfig
from ..config.sections import PIPELINE_SCHEDULES
from ..schema import ConfigError, FieldError
from .choice import StrategyChoice
from .pipeline import pipeline_problems
from .question import PlanQuestion

PLAN_STRATEGIES = ("single", "ddp", "fsdp")
OFFLOAD_SHARDING = ("full_shard", "hybrid_shard")


def pipeline_settings(choice: StrategyChoice) -> DistributedConfig:
    """The pipeline fields of `choice` as the layout's checks and bubble read them."""
    return DistributedConfig(pipeline_parallel=choice.pipeline_parallel, pipeline_schedule=choice.pipeline_schedule,
                             virtual_stages=choice.stages_per_rank)


def _unknown_values(question: PlanQuestion, choice: StrategyChoice) -> Iterator[FieldError]:
    for path, value, choices in (
        ("distributed.strategy", choice.strategy, PLAN_STRATEGIES),
        ("distributed.fsdp_sharding", choice.fsdp_sharding, FSDP_SHARDING),
        ("distributed.mixed_precision_policy", question.precision, PRECISIONS),
        ("distributed.activation_checkpointing", choice.activation_checkpointing, ACTIVATION_CHECKPOINTING),
        ("distributed.pipeline_schedule", choice.pipeline_schedule, PIPELINE_SCHEDULES),
    ):
        if value not in choices:
            yield FieldError(path, f"must be one of {', '.join(choices)}; got {value!r}")


def _bad_counts(question: PlanQuestion, seq_len: int) -> Iterator[FieldError]:
    for path, value in (
        ("training.micro_batch_size", question.micro_batch_size),
        ("training.seq_len", seq_len),
        ("world_size", question.world_size),
        ("distributed.gradient_accumulation_steps", question.micro_batches),
    ):
        if value < 1:
            yield FieldError(path, f"must be >= 1, got {value}")


def _strategy_misfits(question: PlanQuestion, choice: StrategyChoice) -> Iterator[FieldError]:
    """Settings the strategy cannot honour: single on many ranks, offload or hybrid_shard outside their fsdp."""
    strategy, sharding, world_size, node_size = (choice.strategy, choice.fsdp_sharding, question.world_size,
                                                 question.ranks_per_node)
    if strategy == "single" and world_size != 1:
        yield FieldError("distributed.strategy", f"single needs world size 1, got {world_size}")
    if choice.cpu_offload and (strategy != "fsdp" or sharding not in OFFLOAD_SHARDING):
        planned = " or ".join(OFFLOAD_SHARDING)
        yield FieldError("distributed.cpu_offload", f"is planned for fsdp {planned} only, got {strategy} {sharding}")
    if strategy == "fsdp" and sharding == "hybrid_shard" and (not node_size or node_size < 1 or world_size % node_size):
        yield FieldError("node_size", f"hybrid_shard needs ranks per node dividing world size {world_size}, "
                                      f"got {node_size}")


def _tensor_parallel_misfits(question: PlanQuestion, choice: StrategyChoice) -> Iterator[FieldError]:
    tp, node_size = choice.tensor_parallel, question.ranks_per_node
    if tp < 1:
        yield FieldError("distributed.tensor_parallel", f"must be >= 1, got {tp}")
    elif tp > 1:
        if choice.strategy != "fsdp":
            yield FieldError("distributed.tensor_parallel", f"{tp} needs strategy fsdp, got {choice.strategy}")
        if question.world_size % tp:
            yield FieldError("distributed.tensor_parallel",
                             f"{tp} does not divide the world size {question.world_size}")
        hybrid = choice.strategy == "fsdp" and choice.fsdp_sharding == "hybrid_shard"
        if hybrid and node_size and node_size % tp:
            yield FieldError("distributed.tensor_parallel", f"{tp} does not divide the ranks per node {node_size}")


def check_inputs(question: PlanQuestion, choice: StrategyChoice, seq_len: int, units: int) -> None:
    """ConfigError naming every field that keeps `choice` from being planned for `question` (a model of `units`
    units); the pipeline's own checks only once the rest is sound."""
    errors = [*_unknown_values(question, choice), *_bad_counts(question, seq_len),
              *_strategy_misfits(question, choice), *_tensor_parallel_misfits(question, choice)]
    if not errors:
        errors += [FieldError(path, message) for path, message in
                   pipeline_problems(choice.strategy, question.world_size, choice.tensor_parallel,
                                     pipeline_settings(choice), question.micro_batches, units)]
    if errors:
        raise ConfigError(errors)
