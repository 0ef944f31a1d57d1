"""The memory planner: bytes per rank for a BrainAI model, and the cheapest strategy that fits.

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

With pipelineParallel pp (pipeline_plan.py), P is what a rank holds of its
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

Host memory per rank (`plan_host_memory`, what a pod's memory request must
cover): the process itself (torch, and on GPUs the CUDA libraries and
context), initialisation (meta-device init keeps at most one init block or
one tensor being read on the host), the training states themselves when the
device is the CPU, CPU-offloaded states, the asynchronous checkpoint's staging
copy (each rank's parameters and AdamW moments, fp32: 12 bytes per parameter
it holds) and the DataLoader's worker processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

from ..config import ACTIVATION_CHECKPOINTING, FSDP_SHARDING, PRECISIONS, DistributedConfig, ModelConfig, TrainerConfig
from ..config.presets import (
    STACKS,
    BrainAIConfig,
    largest_tensor_params,
    pipeline_unit_count,
    preset_config,
    wrap_unit_params,
)
from ..config.sections import INTERLEAVED, PIPELINE_SCHEDULES
from ..schema import ConfigError, FieldError, Names
from .comms import REDUCE_BYTES, StepCommunication, step_communication
from .layout import bubble_fraction
from .pipeline import RankStage, in_flight, pipeline_problems, rank_units, receive_buffers, split_blocks

MIB = 1024**2
GIB = 1024**3
RUNTIME_OVERHEAD_BYTES = 1 * GIB
PLAN_STRATEGIES = ("single", "ddp", "fsdp")
OFFLOAD_SHARDING = ("full_shard", "hybrid_shard")

PARAM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
ADAM_MOMENT_BYTES = 8  # exp_avg and exp_avg_sq in fp32
MASTER_WEIGHT_BYTES = 4  # fp32 copy kept by the optimizer when parameters are 16-bit
LOGIT_BYTES = 4  # logits and log-probabilities are float32 for the loss
# Per block of a stack that tensor parallelism splits: its norms, whose outputs its colwise linears save all-gathered
# (whole) under sequence parallelism (parallel/tensor.py); all else it saves is on its 1/tp sequence shard or heads.
GATHERED_UNITS = {"reasoning": 2, "decision": 1}

# Host memory (plan_host_memory). Estimates: the process sizes were measured on CPU with torch 2.13
# (about 330 MB resident after importing torch and joining a gloo group); CUDA's figure is the usual
# resident size of a torch process once CUDA, cuBLAS, cuDNN and NCCL are loaded.
CPU_PROCESS_BYTES = 512 * MIB
CUDA_PROCESS_BYTES = 3 * GIB
DATA_WORKER_BYTES = 256 * MIB  # one DataLoader worker process (forked: torch's pages stay shared)
STAGED_BYTES_PER_PARAM = 4 + ADAM_MOMENT_BYTES  # fp32 parameter and moments, as a checkpoint holds them
INIT_BYTES_PER_PARAM = 4  # fp32: the largest tensor drawn or read at once during initialisation
POD_HEADROOM = 1.1  # allocator fragmentation and the page cache of checkpoint writes
REQUEST_GRANULE = 64 * MIB


@dataclass(frozen=True)
class StrategyChoice:
    """The distributed settings a plan assumes."""

    strategy: str
    fsdp_sharding: str = "full_shard"
    activation_checkpointing: str = "none"  # none, full or selective
    cpu_offload: bool = False
    tensor_parallel: int = 1  # ranks splitting each reasoning/decision block (fsdp only)
    pipeline_parallel: int = 1  # pipeline ranks the model's stages are spread over (fsdp only)
    pipeline_schedule: str = "1f1b"
    stages_per_rank: int = 1

    def __str__(self) -> str:
        words = [self.strategy] + ([self.fsdp_sharding] if self.strategy == "fsdp" else [])
        text = " ".join(words)
        if self.tensor_parallel > 1:
            text += f" + tp {self.tensor_parallel}"
        if self.pipeline_parallel > 1:
            per_rank = f", {self.stages_per_rank} stages per rank" if self.pipeline_schedule == INTERLEAVED else ""
            text += f" + pp {self.pipeline_parallel} ({self.pipeline_schedule}{per_rank})"
        if self.activation_checkpointing != "none":
            text += f" + {self.activation_checkpointing} activation checkpointing"
        if self.cpu_offload:
            text += " + CPU offload"
        return text


def gib_rows(rows: list[tuple[str, int]]) -> list[str]:
    """A summary's table: one indented line per (term, bytes), in GiB."""
    return [f"  {name:<17}{size / GIB:9.2f} GiB" for name, size in rows]


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
    pipeline_buffers: int = 0  # the stage boundaries' receive buffers (pipeline_plan.receive_buffers)
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


class InsufficientMemoryError(ConfigError):
    """No strategy fits; `plan` is the smallest one tried and `missing_bytes` what it lacks per rank."""

    def __init__(self, plan: MemoryPlan, device_memory_bytes: int, model_name: str, name: Names = str):
        self.plan = plan
        self.missing_bytes = plan.total - device_memory_bytes
        super().__init__(
            [
                FieldError(
                    name("distributed.strategy"),
                    f"auto: {model_name} does not fit in {device_memory_bytes / GIB:.1f} GiB per rank on "
                    f"{plan.world_size} rank(s); the smallest option, {plan.choice}, needs "
                    f"{plan.total / GIB:.1f} GiB per rank: {self.missing_bytes / GIB:.1f} GiB per rank missing "
                    f"(add ranks, or lower {name('training.micro_batch_size')} or {name('training.seq_len')})",
                )
            ]
        )


def planned_model(model: ModelConfig) -> BrainAIConfig | str:
    """What the planner sizes for a model section: the preset, resized when model.vocab_size says so."""
    if model.vocab_size is None:
        return model.preset
    return preset_config(model.preset, vocab_size=model.vocab_size)


def _model_config(model: BrainAIConfig | str) -> BrainAIConfig:
    return preset_config(model) if isinstance(model, str) else model


def _model_name(model: BrainAIConfig | str) -> str:
    return f"preset {model!r}" if isinstance(model, str) else "the model"


def block_units(cfg: BrainAIConfig, tensor_parallel: int = 1) -> dict[str, float]:
    """Activations one block of each stack saves for backward, per token and rank, in units of d_model elements.

        snn_core 4 + 3 * snn_steps    htm 20    workspace 5
        reasoning 10 + 4 * ffn_hidden / d_model    decision 3 + 4 * ffn_hidden / d_model

    With tensor_parallel tp > 1, sequence parallelism keeps a split block's
    tensors on its sequence shard or its heads, 1/tp of them, except its
    norms' outputs, which DTensor's colwise linears save all-gathered
    (GATHERED_UNITS): reasoning 2 + (8 + 4 * ffn_hidden / d_model) / tp,
    decision 1 + (2 + 4 * ffn_hidden / d_model) / tp. The other stacks are
    replicated: whole.
    """
    mlp = 4 * cfg.ffn_hidden / cfg.d_model
    units = {"snn_core": 4 + 3 * cfg.snn_steps, "htm": 20.0, "workspace": 5.0, "reasoning": 10 + mlp, "decision": 3 + mlp}
    for stack, whole in GATHERED_UNITS.items():
        units[stack] = whole + (units[stack] - whole) / tensor_parallel
    return units


def activation_units(cfg: BrainAIConfig, checkpointing: str, every: int = 2, tensor_parallel: int = 1,
                     held: Sequence[tuple[range, int]] = ()) -> float:
    """Saved activations per token and rank, in units of d_model elements.

    Counted from what each wrap unit keeps for backward (tests measure them
    with saved-tensor hooks on the real model, at tp 1 and 2): encoders 1,
    meta 4, heads 3, and each block of a stack its `block_units`.

    Attention is flash-style (scaled_dot_product_attention), so nothing grows
    with seq_len squared. Checkpointing acts on blocks (blocks.py: the leaf
    wrap units in forward order: encoders, every block, meta, heads): a
    checkpointed block keeps only its input (1 unit; a split block's 1/tp,
    its sequence shard), and one checkpointed block at a time is recomputed
    in full. `full` checkpoints every block, `selective` every `every`-th.

    `held`: under a pipeline, the (units, micro-batches in flight) of each
    stage one rank runs (units: indices into that forward order): what each
    keeps per micro-batch times its micro-batches, plus one recomputed block.
    Empty: the whole model, one micro-batch.
    """
    per_block = block_units(cfg, tensor_parallel)
    units, inputs = [1.0], [1.0]  # per leaf block, kept and kept when checkpointed: encoders, the stacks, meta, heads
    for name, attr in STACKS.items():
        units += [per_block[name]] * getattr(cfg, attr)
        inputs += [1 / tensor_parallel if name in GATHERED_UNITS else 1.0] * getattr(cfg, attr)
    units += [4.0, 3.0]
    inputs += [1.0, 1.0]
    blocks = range(len(units))
    chosen = set({"none": [], "full": blocks, "selective": blocks[every - 1 :: every]}[checkpointing])
    kept = [inputs[i] if i in chosen else units[i] for i in blocks]
    held = held or [(blocks, 1)]
    saved = sum(count * sum(kept[i] for i in run) for run, count in held)
    return saved + max((units[i] for run, _ in held for i in run if i in chosen), default=0.0)


def activation_bytes(
    cfg: BrainAIConfig, precision: str, micro_batch_size: int, seq_len: int, checkpointing: str, every: int = 2,
    tensor_parallel: int = 1, held: Sequence[tuple[range, int]] = (),
) -> int:
    """micro_batch * seq_len * (activation_units * d_model * element bytes + 2 * vocab * 4), per rank.

    The second term is the float32 logits and log-probabilities of the loss (the heads are replicated: whole
    at any tensor_parallel), kept by the stage that holds the heads (`held`, as activation_units) for each of its
    micro-batches in flight.
    """
    tokens = micro_batch_size * seq_len
    per_token = activation_units(cfg, checkpointing, every, tensor_parallel, held) * cfg.d_model * PARAM_BYTES[precision]
    heads = pipeline_unit_count(cfg) - 1
    losses = sum(count for run, count in held if heads in run) if held else 1
    return int(tokens * (per_token + losses * 2 * cfg.vocab_size * LOGIT_BYTES))


def _check_inputs(
    strategy: str,
    fsdp_sharding: str,
    precision: str,
    micro_batch_size: int,
    seq_len: int,
    world_size: int,
    cpu_offload: bool,
    node_size: Optional[int],
    checkpointing: str,
    tensor_parallel: int,
    pipeline: DistributedConfig,
    micro_batches: int,
    units: int,
) -> None:
    errors = [
        FieldError(path, f"must be one of {', '.join(choices)}; got {value!r}")
        for path, value, choices in (
            ("distributed.strategy", strategy, PLAN_STRATEGIES),
            ("distributed.fsdp_sharding", fsdp_sharding, FSDP_SHARDING),
            ("distributed.mixed_precision_policy", precision, PRECISIONS),
            ("distributed.activation_checkpointing", checkpointing, ACTIVATION_CHECKPOINTING),
            ("distributed.pipeline_schedule", pipeline.pipeline_schedule, PIPELINE_SCHEDULES),
        )
        if value not in choices
    ]
    counts = (
        ("training.micro_batch_size", micro_batch_size),
        ("training.seq_len", seq_len),
        ("world_size", world_size),
        ("distributed.gradient_accumulation_steps", micro_batches),
    )
    errors += [FieldError(path, f"must be >= 1, got {value}") for path, value in counts if value < 1]
    if strategy == "single" and world_size != 1:
        errors.append(FieldError("distributed.strategy", f"single needs world size 1, got {world_size}"))
    if cpu_offload and (strategy != "fsdp" or fsdp_sharding not in OFFLOAD_SHARDING):
        planned = " or ".join(OFFLOAD_SHARDING)
        message = f"is planned for fsdp {planned} only, got {strategy} {fsdp_sharding}"
        errors.append(FieldError("distributed.cpu_offload", message))
    hybrid = strategy == "fsdp" and fsdp_sharding == "hybrid_shard"
    if hybrid and (not node_size or node_size < 1 or world_size % node_size):
        message = f"hybrid_shard needs ranks per node dividing world size {world_size}, got {node_size}"
        errors.append(FieldError("node_size", message))
    if tensor_parallel < 1:
        errors.append(FieldError("distributed.tensor_parallel", f"must be >= 1, got {tensor_parallel}"))
    elif tensor_parallel > 1:
        if strategy != "fsdp":
            errors.append(FieldError("distributed.tensor_parallel", f"{tensor_parallel} needs strategy fsdp, got {strategy}"))
        if world_size % tensor_parallel:
            errors.append(FieldError("distributed.tensor_parallel",
                                     f"{tensor_parallel} does not divide the world size {world_size}"))
        if hybrid and node_size and node_size % tensor_parallel:
            errors.append(FieldError("distributed.tensor_parallel",
                                     f"{tensor_parallel} does not divide the ranks per node {node_size}"))
    if not errors:
        errors += [FieldError(path, message) for path, message in
                   pipeline_problems(strategy, world_size, tensor_parallel, pipeline, micro_batches, units)]
    if errors:
        raise ConfigError(errors)


def plan_memory(
    model: BrainAIConfig | str,
    strategy: str,
    *,
    fsdp_sharding: str = "full_shard",
    precision: str = "fp32",
    micro_batch_size: int = 1,
    seq_len: Optional[int] = None,
    world_size: int = 1,
    activation_checkpointing: str = "none",
    activation_checkpointing_every: int = 2,
    cpu_offload: bool = False,
    node_size: Optional[int] = None,
    overhead_bytes: int = RUNTIME_OVERHEAD_BYTES,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    pipeline_schedule: str = "1f1b",
    stages_per_rank: int = 1,
    micro_batches: int = 1,
    pipeline_rank: Optional[int] = None,
) -> MemoryPlan:
    """Bytes per rank for `model` (a BrainAIConfig or a preset name) trained with AdamW, `micro_batches` per
    optimizer step; under a pipeline, of pipeline rank `pipeline_rank` (None: the fullest).

    See the module docstring for the formulas. seq_len defaults to the
    model's max_seq_len; node_size (ranks per node) is needed for
    hybrid_shard only. Bad inputs raise ConfigError naming the field.
    """
    cfg = _model_config(model)
    seq_len = cfg.max_seq_len if seq_len is None else seq_len
    pipeline = DistributedConfig(pipeline_parallel=pipeline_parallel, pipeline_schedule=pipeline_schedule,
                                 virtual_stages=stages_per_rank)
    _check_inputs(strategy, fsdp_sharding, precision, micro_batch_size, seq_len, world_size, cpu_offload, node_size,
                  activation_checkpointing, tensor_parallel, pipeline, micro_batches, pipeline_unit_count(cfg))
    choice = StrategyChoice(strategy, fsdp_sharding, activation_checkpointing, cpu_offload, tensor_parallel,
                            pipeline_parallel, pipeline_schedule, stages_per_rank)
    tp, pp, m = tensor_parallel, pipeline_parallel, micro_batches
    units = wrap_unit_params(cfg, tp)  # what one tp rank holds of each unit
    dp = world_size // (tp * pp)
    param_b = PARAM_BYTES[precision]
    optim_b = ADAM_MOMENT_BYTES + (MASTER_WEIGHT_BYTES if param_b < 4 else 0)
    sharding = fsdp_sharding if strategy == "fsdp" else "no_shard"
    shard = {"no_shard": 1, "shard_grad_op": dp, "full_shard": dp,
             "hybrid_shard": node_size // tp if node_size else node_size}[sharding]
    boundary = micro_batch_size * seq_len * cfg.d_model * param_b  # one activation between two stages

    def rank_plan(rank: int, stages: list[RankStage]) -> MemoryPlan:
        """Pipeline rank `rank`, which runs `stages` (without a pipeline: the whole model)."""
        held = [units[i] for stage in stages for i in stage.units]
        n_params, unit = sum(held), max(held)
        # the sharded (or replicated) states, then the unsharded working copies on top
        params = n_params * param_b if sharding == "shard_grad_op" else n_params * param_b // shard
        grads = n_params * param_b // shard
        optim = n_params * optim_b // shard
        gathered_params = gathered_grads = 0
        if sharding in ("full_shard", "hybrid_shard"):
            gathered_params, gathered_grads = 2 * unit * param_b, unit * param_b
            if pp > 1:  # torch 2.13's stages keep them gathered from the first backward on (stage.py:
                gathered_params = n_params * param_b  # set_reshard_after_backward(False) until perform_reduce_grad)
        if sharding != "no_shard" and m > 1:
            # FSDP2 reduce-scatters on the last micro-batch only (accumulation.py, torch's stages): until then every
            # gradient accumulates unsharded in fp32 (_fsdp_param.py: to_accumulated_grad_if_needed), beside the
            # running unit's fresh one
            gathered_grads = n_params * REDUCE_BYTES + unit * param_b
        host = 0
        if cpu_offload:
            host, params, grads, optim = params + grads + optim, 0, 0, 0
        counts = in_flight(pipeline_schedule, pp, stages_per_rank, m, rank) if pp > 1 else (1,)
        return MemoryPlan(
            choice=choice,
            world_size=world_size,
            shard_size=shard,
            parameters=params + gathered_params,
            gradients=grads + gathered_grads,
            optimizer_state=optim,
            activations=activation_bytes(cfg, precision, micro_batch_size, seq_len, activation_checkpointing,
                                         activation_checkpointing_every, tp,
                                         [(stage.units, count) for stage, count in zip(stages, counts)]),
            overhead=overhead_bytes,
            host=host,
            held_params=n_params,
            tensor_parallel=tp,
            pipeline_parallel=pp,
            pipeline_rank=rank,
            stages=tuple(stage.describe(count) for stage, count in zip(stages, counts)) if pp > 1 else (),
            pipeline_buffers=sum(receive_buffers(stage, m) for stage in stages) * boundary,
            micro_batches=m,
            bubble=bubble_fraction(pipeline, m),
            communication=step_communication(
                strategy=strategy, sharding=sharding, params=n_params, param_bytes=param_b, shard=shard, dp=dp,
                micro_batches=m, activation=boundary, split_blocks=split_blocks(stages), tensor_parallel=tp,
                sends=sum(receive_buffers(stage, 1) for stage in stages)),  # what its neighbours receive
        )

    ranks = rank_units(cfg, seq_len, pp, stages_per_rank, tp)
    if pipeline_rank is None:
        return max((rank_plan(rank, stages) for rank, stages in enumerate(ranks)), key=lambda plan: plan.total)
    if not 0 <= pipeline_rank < pp:
        raise ConfigError([FieldError("pipeline_rank", f"must be in 0 .. {pp - 1}, got {pipeline_rank}")])
    return rank_plan(pipeline_rank, ranks[pipeline_rank])


def strategy_ladder(
    world_size: int, activation_checkpointing: str = "none", cpu_offload: bool = False, tensor_parallel: int = 1,
    pipeline_parallel: int = 1, pipeline_schedule: str = "1f1b", stages_per_rank: int = 1,
) -> list[StrategyChoice]:
    """The options `choose_strategy` tries, cheapest (least communication and recompute) first.

    What the user already requested stays on in every option (the checkpointing
    rungs check every block); options that cannot honour a requested CPU
    offload, or tensor or pipeline parallelism (fsdp only), are left out.
    """
    ladder = [
        StrategyChoice("single" if world_size == 1 else "ddp"),
        StrategyChoice("fsdp", "shard_grad_op"),
        StrategyChoice("fsdp", "full_shard"),
        StrategyChoice("fsdp", "full_shard", activation_checkpointing="full"),
        StrategyChoice("fsdp", "full_shard", activation_checkpointing="full", cpu_offload=True),
    ]
    out: list[StrategyChoice] = []
    for option in ladder:
        if cpu_offload and (option.strategy, option.fsdp_sharding) != ("fsdp", "full_shard"):
            continue
        if (tensor_parallel > 1 or pipeline_parallel > 1) and option.strategy != "fsdp":
            continue
        option = replace(
            option,
            activation_checkpointing=(
                activation_checkpointing if option.activation_checkpointing == "none" else option.activation_checkpointing
            ),
            cpu_offload=option.cpu_offload or cpu_offload,
            tensor_parallel=tensor_parallel,
            pipeline_parallel=pipeline_parallel,
            pipeline_schedule=pipeline_schedule,
            stages_per_rank=stages_per_rank,
        )
        if option not in out:
            out.append(option)
    return out


def tensor_parallel_options(model: BrainAIConfig | str, ranks_per_node: int) -> list[int]:
    """The tensor-parallel degrees `strategy: auto` may pick, smallest first: the divisors of a node's ranks (a tp
    group stays in a node) that divide the model's attention heads and gated-MLP width (whole heads per rank)."""
    cfg = _model_config(model)
    return [tp for tp in range(1, ranks_per_node + 1)
            if ranks_per_node % tp == 0 and cfg.n_heads % tp == 0 and cfg.ffn_hidden % tp == 0]


def pipeline_parallel_options(model: BrainAIConfig | str, ranks: int, stages_per_rank: int = 1) -> list[int]:
    """The pipeline degrees above 1 `strategy: auto` may add, smallest first: those dividing `ranks` (the world over
    the tensor-parallel degree) that leave every stage a block to run."""
    units = pipeline_unit_count(_model_config(model))
    return [pp for pp in range(2, ranks + 1) if ranks % pp == 0 and pp * stages_per_rank <= units]


def plan_ladder(
    model: BrainAIConfig | str,
    *,
    world_size: int,
    precision: str = "fp32",
    micro_batch_size: int = 1,
    seq_len: Optional[int] = None,
    activation_checkpointing: str = "none",
    activation_checkpointing_every: int = 2,
    cpu_offload: bool = False,
    overhead_bytes: int = RUNTIME_OVERHEAD_BYTES,
    tensor_parallel: Optional[int] = 1,
    ranks_per_node: Optional[int] = None,
    pipeline_parallel: Optional[int] = 1,
    pipeline_schedule: str = "1f1b",
    stages_per_rank: int = 1,
    micro_batches: int = 1,
) -> list[tuple[StrategyChoice, MemoryPlan]]:
    """The options `strategy: auto` tries, cheapest first, each with its per-rank plan.

    A set tensor_parallel: every option of `strategy_ladder` at that degree. None (the job leaves it unset): every
    degree of `tensor_parallel_options` for nodes of `ranks_per_node` ranks (unknown: 1 only), smallest first, each
    with the options that keep the states on the device. Then, where pipeline_parallel is None and the node is
    known, each degree of `pipeline_parallel_options` at the largest tensor-parallel degree, smallest first (a
    stage boundary sends one activation per micro-batch, a tp group all-reduces several per block: tp inside a node
    first). Then the CPU-offload options, in the same order (moving every state over PCIe each step costs more).

    `micro_batches`: per optimizer step at the job's own degrees; a degree the planner picks multiplies it, as
    `resolve_distributed` keeps the global batch. So a picked pipeline always gets a multiple of its degree:
    never fewer micro-batches than stages, whole rounds under interleaved-1f1b (layout.micro_batch_problems).
    """
    shape = dict(precision=precision, micro_batch_size=micro_batch_size, seq_len=seq_len, world_size=world_size,
                 activation_checkpointing_every=activation_checkpointing_every, overhead_bytes=overhead_bytes,
                 pipeline_schedule=pipeline_schedule)
    degrees = [1 if tensor_parallel is None else tensor_parallel]
    if tensor_parallel is None and ranks_per_node:
        degrees = [tp for tp in tensor_parallel_options(model, ranks_per_node) if world_size % tp == 0]
    layouts = [(tp, 1 if pipeline_parallel is None else pipeline_parallel) for tp in degrees]
    if pipeline_parallel is None and ranks_per_node:
        layouts += [(degrees[-1], pp) for pp in pipeline_parallel_options(model, world_size // degrees[-1],
                                                                          stages_per_rank)]

    def picked(tp: int, pp: int) -> int:
        return micro_batches * (tp if tensor_parallel is None else 1) * (pp if pipeline_parallel is None else 1)

    ladder = [
        (option, plan_memory(model, option.strategy, fsdp_sharding=option.fsdp_sharding,
                             activation_checkpointing=option.activation_checkpointing, cpu_offload=option.cpu_offload,
                             tensor_parallel=tp, pipeline_parallel=pp, stages_per_rank=option.stages_per_rank,
                             micro_batches=picked(tp, pp), **shape))
        for tp, pp in layouts
        for option in strategy_ladder(world_size, activation_checkpointing, cpu_offload, tp, pp, pipeline_schedule,
                                      stages_per_rank if pp > 1 else 1)
    ]
    # stable: keeps the layouts' order, and each ladder's (where offload already comes last)
    return sorted(ladder, key=lambda entry: entry[0].cpu_offload and not cpu_offload)


def first_fit(
    ladder: list[tuple[StrategyChoice, MemoryPlan]], device_memory_bytes: int, model: BrainAIConfig | str,
    name: Names = str,
) -> tuple[StrategyChoice, MemoryPlan]:
    """The cheapest planned option that fits, else InsufficientMemoryError for the smallest one (its fields spelled
    by `name`: the trainer's keys unless told)."""
    for option, plan in ladder:
        if plan.fits(device_memory_bytes):
            return option, plan
    smallest = min((plan for _, plan in ladder), key=lambda plan: plan.total)
    raise InsufficientMemoryError(smallest, device_memory_bytes, _model_name(model), name)


def choose_strategy(
    model: BrainAIConfig | str,
    *,
    world_size: int,
    device_memory_bytes: int,
    precision: str = "fp32",
    micro_batch_size: int = 1,
    seq_len: Optional[int] = None,
    activation_checkpointing: str = "none",
    activation_checkpointing_every: int = 2,
    cpu_offload: bool = False,
    overhead_bytes: int = RUNTIME_OVERHEAD_BYTES,
    tensor_parallel: Optional[int] = 1,
    ranks_per_node: Optional[int] = None,
    pipeline_parallel: Optional[int] = 1,
    pipeline_schedule: str = "1f1b",
    stages_per_rank: int = 1,
    micro_batches: int = 1,
) -> tuple[StrategyChoice, MemoryPlan]:
    """The first option of `plan_ladder` whose plan fits in device_memory_bytes per rank.

    Raises InsufficientMemoryError (a ConfigError) saying how many GiB per
    rank the smallest option tried lacks (`first_fit`).
    """
    ladder = plan_ladder(
        model,
        world_size=world_size,
        precision=precision,
        micro_batch_size=micro_batch_size,
        seq_len=seq_len,
        activation_checkpointing=activation_checkpointing,
        activation_checkpointing_every=activation_checkpointing_every,
        cpu_offload=cpu_offload,
        overhead_bytes=overhead_bytes,
        tensor_parallel=tensor_parallel,
        ranks_per_node=ranks_per_node,
        pipeline_parallel=pipeline_parallel,
        pipeline_schedule=pipeline_schedule,
        stages_per_rank=stages_per_rank,
        micro_batches=micro_batches,
    )
    return first_fit(ladder, device_memory_bytes, model)


def resolve_distributed(cfg: TrainerConfig, world_size: int, device_memory_bytes: Optional[int],
                        ranks_per_node: Optional[int] = None) -> DistributedConfig:
    """cfg.distributed with `strategy: auto` made concrete; other strategies come back unchanged.

    auto starts from the preset's recommendations (`TrainerConfig.resolved`). One rank -> single; unknown device
    memory (CPU) or a user entrypoint (whose size the planner cannot know without torch) -> ddp, or fsdp under
    tensor or pipeline parallelism (the one strategy they compose with, layout.py); otherwise the planner's
    cheapest fit for the preset, with training.micro_batch_size, training.seq_len, the micro-batches per step,
    distributed.mixed_precision_policy and the job's tensor_parallel and pipeline_parallel. A job that leaves
    them unset lets the planner pick the smallest tensor-parallel degree that fits in nodes of `ranks_per_node`
    ranks, then the smallest pipeline (`plan_ladder`); a picked degree above 1 multiplies
    gradient_accumulation_steps by it when training.global_batch_size is unset (set, the trainer's accumulation
    grows by it alike), so the global batch stays the one the job names at every layout (what the operator
    reports).
    """
    if cfg.distributed.strategy != "auto":
        return cfg.distributed
    dist = cfg.resolved().distributed
    tp, pp = dist.tp, dist.pp
    if world_size == 1 and tp == 1 and pp == 1:
        return replace(dist, strategy="single", tensor_parallel=1, pipeline_parallel=1)
    if device_memory_bytes is None or cfg.model.entrypoint:
        return replace(dist, strategy="fsdp" if tp > 1 or pp > 1 else "ddp", tensor_parallel=tp, pipeline_parallel=pp)
    choice, _ = choose_strategy(
        planned_model(cfg.model),
        world_size=world_size,
        device_memory_bytes=device_memory_bytes,
        precision=dist.mixed_precision_policy,
        micro_batch_size=cfg.training.micro_batch_size,
        seq_len=cfg.training.seq_len,
        activation_checkpointing=dist.activation_checkpointing,
        activation_checkpointing_every=dist.activation_checkpointing_every,
        cpu_offload=dist.cpu_offload,
        tensor_parallel=dist.tensor_parallel,
        ranks_per_node=ranks_per_node,
        pipeline_parallel=dist.pipeline_parallel,
        pipeline_schedule=dist.pipeline_schedule,
        stages_per_rank=dist.stages_per_rank,
        micro_batches=cfg.accumulation_steps(world_size),
    )
    accumulation = dist.gradient_accumulation_steps
    if cfg.training.global_batch_size is None:
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


@dataclass(frozen=True)
class HostPlan:
    """Host (CPU) memory per rank for one plan, and the memory request of a pod running `ranks_per_pod` ranks."""

    plan: MemoryPlan
    accelerator: bool
    ranks_per_pod: int
    process: int  # the Python process: torch, and on GPUs the CUDA libraries and context
    init: int  # the most initialisation holds on the host at once (meta init: one tensor)
    training_states: int  # the device plan's states and activations, when the device is the CPU
    offloaded: int  # CPU-offloaded sharded states
    checkpoint_staging: int  # the async checkpoint's copy of this rank's parameters and optimizer state
    data_workers: int  # DataLoader worker processes

    @property
    def total(self) -> int:
        return (self.process + self.init + self.training_states + self.offloaded + self.checkpoint_staging
                + self.data_workers)

    @property
    def pod_request(self) -> int:
        """Bytes a pod should request: every rank's total with POD_HEADROOM, rounded up (to 64Mi; to 1Gi above 4Gi)."""
        wanted = self.total * self.ranks_per_pod * POD_HEADROOM
        granule = GIB if wanted > 4 * GIB else REQUEST_GRANULE
        return -int(-wanted // granule) * granule

    def summary(self) -> str:
        device = "GPU" if self.accelerator else "CPU"
        rows = [
            ("process", self.process),
            ("initialisation", self.init),
            ("training states", self.training_states),
            ("CPU offload", self.offloaded),
            ("ckpt staging", self.checkpoint_staging),
            ("data workers", self.data_workers),
            ("total", self.total),
        ]
        lines = [f"host memory per rank ({self.plan.choice} on {device}):", *gib_rows(rows)]
        lines.append(f"recommended pod memory request: {quantity(self.pod_request)} "
                     f"({self.ranks_per_pod} rank(s) per pod, +{POD_HEADROOM - 1:.0%})")
        return "\n".join(lines)


def quantity(size: int) -> str:
    """Bytes as a Kubernetes quantity: whole Gi when exact, else Mi."""
    return f"{size // GIB}Gi" if size % GIB == 0 else f"{-(-size // MIB)}Mi"


def plan_host_memory(
    model: BrainAIConfig | str,
    plan: MemoryPlan,
    *,
    accelerator: bool,
    ranks_per_pod: int = 1,
    async_checkpoint: bool = True,
    checkpointing: bool = True,
    data_workers: int = 0,
) -> HostPlan:
    """Host memory per rank for `plan` (see the module docstring); `accelerator`: the device is a GPU, else the CPU."""
    cfg = _model_config(model)
    held = -(-plan.held_params // plan.shard_size)
    return HostPlan(
        plan=plan,
        accelerator=accelerator,
        ranks_per_pod=ranks_per_pod,
        process=CUDA_PROCESS_BYTES if accelerator else CPU_PROCESS_BYTES,
        init=largest_tensor_params(cfg) * INIT_BYTES_PER_PARAM,
        training_states=0 if accelerator else plan.total - plan.overhead,
        offloaded=plan.host,
        checkpoint_staging=held * STAGED_BYTES_PER_PARAM if checkpointing and async_checkpoint else 0,
        data_workers=data_workers * DATA_WORKER_BYTES,
    )


def rank_estimate(cfg: TrainerConfig, dist: DistributedConfig, world_size: int, *, node_size: int,
                  accelerator: bool) -> Optional[int]:
    """The planner's bytes per rank for a run's resolved strategy: device memory on an accelerator, host memory on
    the CPU; None for a user model (its size is unknown here)."""
    if cfg.model.entrypoint:
        return None
    try:
        plan = plan_memory(
            planned_model(cfg.model), dist.strategy, fsdp_sharding=dist.fsdp_sharding, precision=dist.mixed_precision_policy,
            micro_batch_size=cfg.training.micro_batch_size, seq_len=cfg.training.seq_len, world_size=world_size,
            activation_checkpointing=dist.activation_checkpointing,
            activation_checkpointing_every=dist.activation_checkpointing_every, cpu_offload=dist.cpu_offload,
            node_size=node_size, tensor_parallel=dist.tp, pipeline_parallel=dist.pp,
            pipeline_schedule=dist.pipeline_schedule, stages_per_rank=dist.stages_per_rank,
            micro_batches=replace(cfg, distributed=dist).accumulation_steps(world_size),
        )
    except ConfigError:
        return None
    if accelerator:
        return plan.total
    return plan_host_memory(planned_model(cfg.model), plan, accelerator=False, async_checkpoint=cfg.checkpoint.async_save,
                            checkpointing=cfg.checkpoint.enabled, data_workers=cfg.data.num_workers).total


# A committed checkpoint beyond its tensors: DCP's .metadata, the manifest, the RNG and schedule states, pickle headers.
CHECKPOINT_EXTRA_BYTES = 1 * MIB


def checkpoint_bytes(n_params: int) -> int:
    """A committed checkpoint's size for a model of `n_params` parameters: each in fp32 with AdamW's two fp32
    moments (the staged copy's 12 bytes per parameter, whatever the strategy), plus CHECKPOINT_EXTRA_BYTES."""
    return n_params * STAGED_BYTES_PER_PARAM + CHECKPOINT_EXTRA_BYTES


def preset_checkpoint_bytes(model: BrainAIConfig | str) -> int:
    """`checkpoint_bytes` of a preset (or a BrainAIConfig)."""
    return checkpoint_bytes(sum(wrap_unit_params(_model_config(model))))
