"""The options `strategy: auto` tries, cheapest first, and the first that fits (torch-free)."""

from __future__ import annotations

from dataclasses import replace

from ..config.presets import BrainAIConfig, pipeline_unit_count
from ..schema import ConfigError, FieldError, Names
from .bytes import GIB
from .choice import StrategyChoice
from .memory import MemoryPlan, plan_for
from .question import PlanQuestion, model_config, model_name

Ladder = list[tuple[StrategyChoice, MemoryPlan]]


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
    cfg = model_config(model)
    return [tp for tp in range(1, ranks_per_node + 1)
            if ranks_per_node % tp == 0 and cfg.n_heads % tp == 0 and cfg.ffn_hidden % tp == 0]


def pipeline_parallel_options(model: BrainAIConfig | str, ranks: int, stages_per_rank: int = 1) -> list[int]:
    """The pipeline degrees above 1 `strategy: auto` may add, smallest first: those dividing `ranks` (the world over
    the tensor-parallel degree) that leave every stage a block to run."""
    units = pipeline_unit_count(model_config(model))
    return [pp for pp in range(2, ranks + 1) if ranks % pp == 0 and pp * stages_per_rank <= units]


def layouts(question: PlanQuestion) -> list[tuple[int, int]]:
    """The (tp, pp) degrees `plan_ladder` tries, in its order (see there)."""
    tp, pp, node = question.tensor_parallel, question.pipeline_parallel, question.ranks_per_node
    degrees = [1 if tp is None else tp]
    if tp is None and node:
        degrees = [d for d in tensor_parallel_options(question.model, node) if question.world_size % d == 0]
    tried = [(d, 1 if pp is None else pp) for d in degrees]
    if pp is None and node:
        ranks = question.world_size // degrees[-1]
        tried += [(degrees[-1], p) for p in pipeline_parallel_options(question.model, ranks, question.stages_per_rank)]
    return tried


def plan_ladder(question: PlanQuestion) -> Ladder:
    """The options `strategy: auto` tries for `question`, cheapest first, each with its per-rank plan.

    A set tensor_parallel: every option of `strategy_ladder` at that degree. None (the job leaves it unset): every
    degree of `tensor_parallel_options` for nodes of `ranks_per_node` ranks (unknown: 1 only), smallest first, each
    with the options that keep the states on the device. Then, where pipeline_parallel is None and the node is
    known, each degree of `pipeline_parallel_options` at the largest tensor-parallel degree, smallest first (a
    stage boundary sends one activation per micro-batch, a tp group all-reduces several per block: tp inside a node
    first). Then the CPU-offload options, in the same order (moving every state over PCIe each step costs more).

    A degree the planner picks multiplies the question's micro-batches, as `resolve_distributed` keeps the global
    batch. So a picked pipeline always gets a multiple of its degree: never fewer micro-batches than stages, whole
    rounds under interleaved-1f1b (layout.micro_batch_problems).
    """
    q = question

    def picked(tp: int, pp: int) -> PlanQuestion:
        scale = (tp if q.tensor_parallel is None else 1) * (pp if q.pipeline_parallel is None else 1)
        return replace(q, micro_batches=q.micro_batches * scale)

    ladder = [
        (option, plan_for(picked(tp, pp), option))
        for tp, pp in layouts(q)
        for option in strategy_ladder(q.world_size, q.activation_checkpointing, q.cpu_offload, tp, pp,
                                      q.pipeline_schedule, q.stages_per_rank if pp > 1 else 1)
    ]
    # stable: keeps the layouts' order, and each ladder's (where offload already comes last)
    return sorted(ladder, key=lambda entry: entry[0].cpu_offload and not q.cpu_offload)


def first_fit(ladder: Ladder, device_memory_bytes: int, model: BrainAIConfig | str,
              name: Names = str) -> tuple[StrategyChoice, MemoryPlan]:
    """The cheapest planned option that fits, else InsufficientMemoryError for the smallest one (its fields spelled
    by `name`: the trainer's keys unless told)."""
    for option, plan in ladder:
        if plan.fits(device_memory_bytes):
            return option, plan
    smallest = min((plan for _, plan in ladder), key=lambda plan: plan.total)
    raise InsufficientMemoryError(smallest, device_memory_bytes, model_name(model), name)


def choose_strategy(question: PlanQuestion) -> tuple[StrategyChoice, MemoryPlan]:
    """The first option of `plan_ladder` whose plan fits in the question's device memory per rank.

    Raises InsufficientMemoryError (a ConfigError) saying how many GiB per
    rank the smallest option tried lacks (`first_fit`).
    """
    if question.device_memory_bytes is None:
        raise ValueError("choose_strategy needs the device memory (PlanQuestion.device_memory_bytes)")
    return first_fit(plan_ladder(question), question.device_memory_bytes, question.model)
