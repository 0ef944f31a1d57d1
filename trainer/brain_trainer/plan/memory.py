"""The memory planner's model: bytes per rank for a BrainAI model under one strategy (`plan_for`; the cheapest
strategy that fits is ladder.py's).

Torch-free (the operator calls it). All sizes are per rank, in bytes, and
are estimates: they follow the ZeRO accounting (Rajbhandari et al., 2020) for
model states and count the tensors BrainAI's blocks save for backward.

Model states, with P parameters and N ranks sharing a shard:

    bytes per parameter      fp32   bf16 / fp16
    parameters                  4            2
    gradients                   4            2
    optimizer (AdamW)           8           12   (two fp32 moments, + fp32 master weights)

    strategy                        parameters         gradients        optimizer
    single, ddp, fsdp no_shard      P                  P                P
    fsdp shard_grad_op (ZeRO-2)     P                  P / N            P / N
    fsdp full_shard    (ZeRO-3)     P / N + 2 U        P / N + U        P / N
    fsdp hybrid_shard               as full_shard, with N = ranks per node

With tensorParallel tp, P is what one tp rank holds (the split parameters of
the reasoning and decision blocks divided by tp, the rest whole:
presets.wrap_unit_params) and N counts data-parallel ranks only (world size /
tp; hybrid_shard: ranks per node / tp). Sequence parallelism divides the
split blocks' activations by tp, all but their norms' all-gathered outputs
(`activation_units`).

U is the largest FSDP wrap unit: full_shard gathers the running unit and
prefetches the next, and holds one unit's unsharded gradients until they are
reduce-scattered. With m > 1 micro-batches per step FSDP2 reduce-scatters on
the last one only, so every sharded strategy holds each gradient unsharded in
fp32 until then: 4 P (+ U's fresh gradients) in place of the gradients' U.

With pipelineParallel pp (pipeline.py), P is what a rank holds of its
stages' units, N counts world / (tp x pp), and the fullest pipeline rank is
planned. torch's stages keep FSDP's parameters gathered from a step's first
backward to its end, so full_shard holds P / N + P of them. Its activations
are each stage's per micro-batch times its micro-batches in flight under the
schedule, plus the stage boundaries' receive buffers.

With CPU offload the sharded parameters, gradients and optimizer state live
in host memory (`host`), the device keeps only the gathered units and the
accumulated gradients (planned for full_shard and hybrid_shard).

Activations (see `activation_bytes`), and a fixed `overhead` for the CUDA
context, communication buffers and allocator slack, complete the total.
"""


from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..config.presets import BrainAIConfig, pipeline_unit_count, wrap_unit_params
from ..schema import ConfigError, FieldError
from .activations import activation_bytes
from .bytes import ADAM_MOMENT_BYTES, GIB, MASTER_WEIGHT_BYTES, PARAM_BYTES, gib_rows
from .checks import check_inputs, pipeline_settings
from .choice import StrategyChoice
from .comms import REDUCE_BYTES, StepCommunication, step_communication
from .layout import bubble_fraction
from .pipeline import RankStage, in_flight, rank_units, receive_buffers, split_blocks
from .question import PlanQuestion, model_config


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per rank for one model under one choice of strategy."""

    choice: StrategyChoice
    world_size: int
    shard_size: int  # ranks that share one copy of the sharded states (1: replicated)
    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    overhead: int
    host: int  # bytes per rank kept in CPU memory (CPU offload)
    held_params: int  # parameters the rank holds before FSDP shards them (its tp share of its stages' units)
    tensor_parallel: int = 1  # ranks splitting each reasoning/decision block
    pipeline_parallel: int = 1
    pipeline_rank: int = 0  # the pipeline rank planned: the heaviest
    stages: tuple[str, ...] = ()  # under a pipeline, the planned rank's stages: "stage 0: encoders .. htm.blocks.1"
    pipeline_buffers: int = 0  # the stage boundaries' receive buffers (pipeline.receive_buffers)
    micro_batches: int = 1  # per optimizer step
    bubble: float = 0.0  # share of a step the pipeline idles (layout.bubble_fraction)
    communication: StepCommunication = field(default_factory=StepCommunication)

    @property
    def total(self) -> int:
        """Device bytes per rank."""
        return (self.parameters + self.gradients + self.optimizer_state + self.activations + self.pipeline_buffers
                + self.overhead)

    def fits(self, device_memory_bytes: int) -> bool:
        return self.total <= device_memory_bytes

    def summary(self) -> str:
        """One line per term, in GiB."""
        rows = [
            ("parameters", self.parameters),
            ("gradients", self.gradients),
            ("optimizer state", self.optimizer_state),
            ("activations", self.activations),
            *([("pipeline buffers", self.pipeline_buffers)] if self.pipeline_parallel > 1 else []),
            ("overhead", self.overhead),
            ("total", self.total),
        ]
        if self.host:
            rows.append(("host (offloaded)", self.host))
        lines = [f"{self.choice} on {self.world_size} rank(s), per rank:", *gib_rows(rows)]
        if self.pipeline_parallel > 1:
            lines[1:1] = [f"  pipeline rank {self.pipeline_rank} of {self.pipeline_parallel} (the fullest), "
                          f"{self.micro_batches} micro-batches per step, bubble {self.bubble:.1%}:",
                          *(f"    {stage}" for stage in self.stages)]
        sent = self.communication
        lines += [f"  communication per step, sent by each rank: {sent.total / GIB:.2f} GiB",
                  *(f"  {row}" for row in gib_rows(sent.rows()))]
        return "\n".join(lines)


@dataclass(frozen=True)
class _Sizing:
    """What every pipeline rank's plan of one (question, choice) shares."""

    question: PlanQuestion
    choice: StrategyChoice
    cfg: BrainAIConfig
    seq_len: int
    units: list[int]  # what one tp rank holds of each unit, in forward order
    sharding: str  # the choice's FSDP sharding; no_shard for single and ddp
    shard: int  # ranks sharing one copy of the sharded states
    dp: int  # data-parallel ranks
    param_b: int
    optim_b: int

    @property
    def boundary(self) -> int:
        """One activation between two stages, in bytes."""
        return self.question.micro_batch_size * self.seq_len * self.cfg.d_model * self.param_b


def _sizing(question: PlanQuestion, choice: StrategyChoice, cfg: BrainAIConfig, seq_len: int) -> _Sizing:
    tp, pp = choice.tensor_parallel, choice.pipeline_parallel
    dp = question.world_size // (tp * pp)
    param_b = PARAM_BYTES[question.precision]
    sharding = choice.fsdp_sharding if choice.strategy == "fsdp" else "no_shard"
    node = question.ranks_per_node
    shards = {"no_shard": 1, "shard_grad_op": dp, "full_shard": dp, "hybrid_shard": node // tp if node else node}
    shard = shards[sharding]
    return _Sizing(question, choice, cfg, seq_len, wrap_unit_params(cfg, tp), sharding, shard, dp, param_b,
                   ADAM_MOMENT_BYTES + (MASTER_WEIGHT_BYTES if param_b < 4 else 0))


def _states(s: _Sizing, n_params: int, unit: int) -> tuple[int, int, int, int]:
    """(parameters, gradients, optimizer state, host) bytes of a rank holding `n_params`, its largest unit `unit`:
    the sharded (or replicated) states, then the unsharded working copies on top."""
    sharding, shard, param_b = s.sharding, s.shard, s.param_b
    params = n_params * param_b if sharding == "shard_grad_op" else n_params * param_b // shard
    grads = n_params * param_b // shard
    optim = n_params * s.optim_b // shard
    gathered_params = gathered_grads = 0
    if sharding in ("full_shard", "hybrid_shard"):
        gathered_params, gathered_grads = 2 * unit * param_b, unit * param_b
        # torch 2.13's stages keep them gathered from the first backward on (stage.py:
        # set_reshard_after_backward(False) until perform_reduce_grad)
        if s.choice.pipeline_parallel > 1:
            gathered_params = n_params * param_b
    if sharding != "no_shard" and s.question.micro_batches > 1:
        # FSDP2 reduce-scatters on the last micro-batch only (loop/accumulation.py, torch's stages): until then
        # every gradient accumulates unsharded in fp32 (_fsdp_param.py: to_accumulated_grad_if_needed), beside the
        # running unit's fresh one
        gathered_grads = n_params * REDUCE_BYTES + unit * param_b
    host = 0
    if s.choice.cpu_offload:
        host, params, grads, optim = params + grads + optim, 0, 0, 0
    return params + gathered_params, grads + gathered_grads, optim, host


def _rank_plan(s: _Sizing, rank: int, stages: list[RankStage]) -> MemoryPlan:
    """Pipeline rank `rank`, which runs `stages` (without a pipeline: the whole model)."""
    question, choice = s.question, s.choice
    tp, pp, m = choice.tensor_parallel, choice.pipeline_parallel, question.micro_batches
    held = [s.units[i] for stage in stages for i in stage.units]
    n_params = sum(held)
    params, grads, optim, host = _states(s, n_params, max(held))
    counts = in_flight(choice.pipeline_schedule, pp, choice.stages_per_rank, m, rank) if pp > 1 else (1,)
    return MemoryPlan(
        choice=choice, world_size=question.world_size, shard_size=s.shard,
        parameters=params, gradients=grads, optimizer_state=optim,
        activations=activation_bytes(s.cfg, question.precision, question.micro_batch_size, s.seq_len,
                                     choice.activation_checkpointing, question.activation_checkpointing_every, tp,
                                     [(stage.units, count) for stage, count in zip(stages, counts)]),
        overhead=question.overhead_bytes, host=host, held_params=n_params,
        tensor_parallel=tp, pipeline_parallel=pp, pipeline_rank=rank,
        stages=tuple(stage.describe(count) for stage, count in zip(stages, counts)) if pp > 1 else (),
        pipeline_buffers=sum(receive_buffers(stage, m) for stage in stages) * s.boundary,
        micro_batches=m, bubble=bubble_fraction(pipeline_settings(choice), m),
        communication=step_communication(
            strategy=choice.strategy, sharding=s.sharding, params=n_params, param_bytes=s.param_b, shard=s.shard,
            dp=s.dp, micro_batches=m, activation=s.boundary, split_blocks=split_blocks(stages), tensor_parallel=tp,
            sends=sum(receive_buffers(stage, 1) for stage in stages)),  # what its neighbours receive
    )


def plan_for(question: PlanQuestion, choice: StrategyChoice, pipeline_rank: Optional[int] = None) -> MemoryPlan:
    """Bytes per rank for `question` under `choice`; under a pipeline, of pipeline rank `pipeline_rank` (None: the
    fullest). Bad inputs raise ConfigError naming the field (checks.py)."""
    cfg = model_config(question.model)
    seq_len = cfg.max_seq_len if question.seq_len is None else question.seq_len
    check_inputs(question, choice, seq_len, pipeline_unit_count(cfg))
    sizing = _sizing(question, choice, cfg, seq_len)
    pp = choice.pipeline_parallel
    ranks = rank_units(cfg, seq_len, pp, choice.stages_per_rank, choice.tensor_parallel)
    if pipeline_rank is None:
        return max((_rank_plan(sizing, rank, stages) for rank, stages in enumerate(ranks)), key=lambda plan: plan.total)
    if not 0 <= pipeline_rank < pp:
        raise ConfigError([FieldError("pipeline_rank", f"must be in 0 .. {pp - 1}, got {pipeline_rank}")])
    return _rank_plan(sizing, pipeline_rank, ranks[pipeline_rank])


def plan_memory(
    model: BrainAIConfig | str,
    strategy: str,
    *,
    fsdp_sharding: str = "full_shard",
    activation_checkpointing: str = "none",
    cpu_offload: bool = False,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    pipeline_schedule: str = "1f1b",
    stages_per_rank: int = 1,
    node_size: Optional[int] = None,
    pipeline_rank: Optional[int] = None,
    **question: Any,
) -> MemoryPlan:
    """Bytes per rank for `model` (a BrainAIConfig or a preset name) trained with AdamW under `strategy` and the
    settings after it; `question`: the rest of a PlanQuestion (world_size, precision, micro_batch_size, seq_len,
    micro_batches, ...). See the module docstring for the formulas; seq_len defaults to the model's max_seq_len,
    node_size (ranks per node) is needed for hybrid_shard only."""
    choice = StrategyChoice(strategy, fsdp_sharding, activation_checkpointing, cpu_offload, tensor_parallel,
                            pipeline_parallel, pipeline_schedule, stages_per_rank)
    return plan_for(PlanQuestion(model, ranks_per_node=node_size, strategy=strategy, **question), choice, pipeline_rank)
