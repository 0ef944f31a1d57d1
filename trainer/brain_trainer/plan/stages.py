"""Where BrainAI is cut into pipeline stages (torch-free: the planner, `braintrain estimate` and the trainer agree).

The model is a chain of units in forward order, cut only between them:

    encoders, snn_core.blocks.0 .., htm.blocks.0 .., workspace.blocks.0 .., reasoning.blocks.0 ..,
    decision.blocks.0 .., meta, heads

A unit's cost is its share of the model's training FLOPs (time) plus its
share of the parameters (memory), so neither the slowest stage nor the
fullest one sets the pace alone. `stage_plan` cuts the chain into contiguous
stages with the smallest largest cost (exact: a linear-partition search).
With several stages per pipeline rank (interleaved-1f1b), stage s runs on
pipeline rank s mod pp, the order torch.distributed.pipelining's looped
schedules expect.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

from ..config.model_flops import FLOPS_PER_MULTIPLY_ADD, FORWARD_BACKWARD
from ..config.presets import STACKS, BrainAIConfig, module_param_counts, split_block_params


@dataclass(frozen=True)
class Unit:
    """One link of the chain: a top-level module or one block of a stack."""

    name: str  # qualified module name, as in the model's state dict (reasoning.blocks.3)
    params: int
    flops: int  # training FLOPs per token (config/model_flops.py's definition)


@dataclass(frozen=True)
class Stage:
    """A contiguous run of units, run by pipeline rank `rank`."""

    index: int
    rank: int
    units: tuple[Unit, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(unit.name for unit in self.units)

    @property
    def params(self) -> int:
        return sum(unit.params for unit in self.units)

    @property
    def flops(self) -> int:
        return sum(unit.flops for unit in self.units)


def _unit_multiply_adds(cfg: BrainAIConfig, seq_len: int) -> dict[str, int]:
    """Multiply-adds per token of one unit of each module (config/model_flops.py, term by term)."""
    d, f = cfg.d_model, cfg.ffn_hidden
    return {
        "encoders": d * cfg.conv_kernel,
        "snn_core": 2 * d * d,
        "htm": 4 * d * d,
        "workspace": 2 * d * d + 2 * cfg.n_slots * d,
        "reasoning": 4 * d * d + 3 * d * f + 2 * seq_len * d,
        "decision": 3 * d * f,
        "meta": d * d + d,
        "heads": d * cfg.vocab_size,
    }


def pipeline_units(cfg: BrainAIConfig, seq_len: int, tensor_parallel: int = 1) -> list[Unit]:
    """BrainAI's units in forward order; with `tensor_parallel`, what one tp rank holds and computes of each."""
    params = module_param_counts(cfg)
    split = split_block_params(cfg)
    multiply_adds = _unit_multiply_adds(cfg, seq_len)
    units = []
    for module, total in params.items():
        count = getattr(cfg, STACKS[module]) if module in STACKS else 1
        whole = split.get(module, 0)
        held = total // count - whole + whole // tensor_parallel
        # a split block's matmuls divide over the tp ranks like its weights; the rest is computed whole
        flops = FORWARD_BACKWARD * FLOPS_PER_MULTIPLY_ADD * (
            multiply_adds[module] if not whole else multiply_adds[module] // tensor_parallel)
        names = [f"{module}.blocks.{i}" for i in range(count)] if module in STACKS else [module]
        units.extend(Unit(name, held, flops) for name in names)
    return units


def balance(costs: Sequence[Fraction], parts: int) -> list[range]:
    """Cut `costs` into `parts` contiguous non-empty runs whose largest sum is the smallest possible."""
    n = len(costs)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot cut {n} units into {parts} stages")
    prefix = [Fraction(0)]
    for cost in costs:
        prefix.append(prefix[-1] + cost)
    # best[k][i]: the smallest largest run cutting the first i units into k runs; cut[k][i]: where the last run starts
    best = [[None] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = Fraction(0)
    for k in range(1, parts + 1):
        for i in range(k, n - parts + k + 1):
            for j in range(k - 1, i):
                if best[k - 1][j] is None:
                    continue
                worst = max(best[k - 1][j], prefix[i] - prefix[j])
                if best[k][i] is None or worst < best[k][i]:
                    best[k][i], cut[k][i] = worst, j
    runs, end = [], n
    for k in range(parts, 0, -1):
        runs.append(range(cut[k][end], end))
        end = cut[k][end]
    return runs[::-1]


def stage_plan(cfg: BrainAIConfig, seq_len: int, pipeline_parallel: int, stages_per_rank: int = 1,
               tensor_parallel: int = 1) -> list[Stage]:
    """The model's `pipeline_parallel x stages_per_rank` stages in forward order, balanced (see the module doc)."""
    units = pipeline_units(cfg, seq_len, tensor_parallel)
    total_params = sum(unit.params for unit in units)
    total_flops = sum(unit.flops for unit in units)
    costs = [Fraction(unit.flops, total_flops) + Fraction(unit.params, total_params) for unit in units]
    runs = balance(costs, pipeline_parallel * stages_per_rank)
    return [Stage(index=s, rank=s % pipeline_parallel, units=tuple(units[i] for i in run)) for s, run in enumerate(runs)]
