"""plan/stages.py: where BrainAI is cut into pipeline stages, checked against the model and the FLOP formula."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from brain_trainer.config.model_flops import training_flops_per_token
from brain_trainer.config.presets import MODEL_PRESETS, param_count, pipeline_unit_count, preset_config
from brain_trainer.model.brain_ai import BrainAI
from brain_trainer.plan.stages import balance, pipeline_units, stage_plan


@pytest.mark.parametrize("preset", ["minimal", "1b", "70b"])
def test_units_add_up_to_the_model_and_its_flops(preset):
    cfg = preset_config(preset)
    units = pipeline_units(cfg, seq_len=512)
    assert sum(unit.params for unit in units) == param_count(cfg)
    assert sum(unit.flops for unit in units) == training_flops_per_token(cfg, 512)
    assert len(units) == pipeline_unit_count(cfg)


def test_unit_names_and_sizes_are_the_real_modules():
    with torch.device("meta"):
        model = BrainAI.from_preset("minimal")
    modules = dict(model.named_modules())
    for unit in pipeline_units(preset_config("minimal"), seq_len=64):
        assert sum(p.numel() for p in modules[unit.name].parameters()) == unit.params, unit.name
    assert [u.name for u in pipeline_units(preset_config("minimal"), 64)][:2] == ["encoders", "snn_core.blocks.0"]


def brute_force(costs, parts):
    """The smallest largest run over every way of cutting."""
    from itertools import combinations
    n = len(costs)
    return min(max(sum(costs[a:b]) for a, b in zip((0, *cuts), (*cuts, n)))
               for cuts in combinations(range(1, n), parts - 1))


@pytest.mark.parametrize("costs, parts", [([5, 1, 1, 1, 1, 1], 2), ([1, 9, 1, 1, 9, 1, 3], 3), ([2] * 7, 4),
                                          ([1, 2, 3, 4, 5, 6, 7, 8], 5)])
def test_balance_is_optimal_contiguous_and_covers_every_unit(costs, parts):
    runs = balance([Fraction(c) for c in costs], parts)
    assert [i for run in runs for i in run] == list(range(len(costs)))
    assert all(len(run) for run in runs)
    assert max(sum(costs[i] for i in run) for run in runs) == brute_force(costs, parts)


def test_balance_refuses_more_stages_than_units():
    with pytest.raises(ValueError, match="cannot cut 3 units into 4 stages"):
        balance([Fraction(1)] * 3, 4)


def test_seventy_b_on_eight_ranks_is_balanced_and_interleaved_stages_go_round_the_ranks():
    cfg = MODEL_PRESETS["70b"]
    stages = stage_plan(cfg, 4096, pipeline_parallel=8, stages_per_rank=2)
    assert [stage.rank for stage in stages] == list(range(8)) * 2
    assert stages[0].names[0] == "encoders" and stages[-1].names[-1] == "heads"
    flops = [stage.flops for stage in stages]
    # 91 units of ~1/80 each cut 16 ways: no stage is more than one reasoning block above the mean
    assert max(flops) <= sum(flops) / 16 + max(unit.flops for unit in pipeline_units(cfg, 4096))
