"""The 13b and 70b presets split and sharded as planned (tp x dp, and tp x pp x dp), without a cluster.

Like the 7b proof (test_fsdp_scale.py): the `fake` process group lets one
process act as any rank of a large world, and the meta device gives the
parameters shapes but no storage, so FSDPWrapper builds the real 2-D mesh
(dp x tp), splits the real blocks over tp and shards over dp exactly as on a
cluster. The layout comes from the planner (`resolve_distributed`, as the
trainer resolves `strategy: auto`), and every rank's shards stay within the
planner's per-rank figure. Each rank examined gets a copy of one meta model:
nothing is ever allocated.

Under a pipeline, PipelineWrapper builds everything a rank runs with: it cuts
the model to the rank's stages, splits and shards them over the 3-D mesh
("pp", "shard", "tp"), and builds the PipelineStages and the schedule, none
of which communicates before the first step; so the proof covers the whole
setup, and each rank's shards stay within the planner's figure for its own
pipeline rank.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from brain_trainer import BrainAI, FSDPWrapper, TrainerConfig
from brain_trainer.config.presets import MODEL_PRESETS, param_count, wrap_unit_params
from brain_trainer.loop.loss import loss_fn
from brain_trainer.plan.layout import Layout
from brain_trainer.plan import GIB, plan_memory, resolve_distributed
from brain_trainer.parallel.pipeline import PipelineWrapper
from brain_trainer.parallel.step import StepSettings
from brain_trainer.plan.stages import stage_plan

GPUS_PER_NODE = 8
DEVICE_MEMORY = 80 * GIB
PIPELINE_DEVICE_MEMORY = 48 * GIB  # where a node of tp8 is not enough for 70b: the planner adds a pipeline
SEQ_LEN = 4096
SPLIT = "reasoning.blocks.0.q.weight"  # a colwise linear: split over tp, then sharded over dp
# device bytes per sharded element under FSDP2 + AdamW: fp32 parameter shard (the master weights), fp32 gradient
# shard, two fp32 moments; the planner's bf16 accounting (2 + 2 + 12) comes to the same 16
STATE_BYTES_PER_ELEMENT = 4 + 4 + 8


def _job(preset, tp):
    return TrainerConfig.from_dict({
        "model": {"preset": preset},
        "training": {"micro_batch_size": 1, "seq_len": SEQ_LEN},
        "distributed": {"strategy": "auto", "tensor_parallel": tp, "mixed_precision_policy": "bf16"},
    })


def _shard_on_rank(model, config, rank, world_size):
    """(local parameter elements, all local shards on meta in fp32, the split parameter's mesh, local and full numel)."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        sharded = FSDPWrapper(copy.deepcopy(model), config).setup(rank, world_size)
        params = dict(sharded.named_parameters())
        shards = [p.to_local() for p in params.values()]
        split = params[SPLIT]
        return (
            sum(s.numel() for s in shards),
            all(s.is_meta and s.dtype == torch.float32 for s in shards),
            split.device_mesh.mesh_dim_names if isinstance(split, DTensor) else None,
            (split.to_local().numel(), split.numel()),
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("preset, nodes, tp", [("70b", 8, 8), ("13b", 2, 4)])
def test_planned_tp_layout_shards_within_the_planners_figure(preset, nodes, tp, monkeypatch):
    world = nodes * GPUS_PER_NODE
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(GPUS_PER_NODE))
    config = resolve_distributed(_job(preset, tp), world, DEVICE_MEMORY)
    assert (config.strategy, config.tensor_parallel) == ("fsdp", tp)
    plan = plan_memory(preset, config.strategy, fsdp_sharding=config.fsdp_sharding,
                       precision=config.mixed_precision_policy, micro_batch_size=1, seq_len=SEQ_LEN,
                       world_size=world, activation_checkpointing=config.activation_checkpointing, tensor_parallel=tp)
    assert plan.fits(DEVICE_MEMORY)
    dp = world // tp
    held = sum(wrap_unit_params(MODEL_PRESETS[preset], tp))  # what one tp rank holds before dp sharding

    with torch.device("meta"):
        model = BrainAI.from_preset(preset)
    assert sum(p.numel() for p in model.parameters()) == param_count(preset)
    # ranks are tp-innermost: the tp group of dp rank 0, and the dp ranks of tp rank 0 and of the last tp rank
    tp_group = list(range(tp))
    dp_columns = {t: [d * tp + t for d in range(dp)] for t in (0, tp - 1)}
    ranks = sorted({*tp_group, *(r for column in dp_columns.values() for r in column)})
    results = {rank: _shard_on_rank(model, config, rank, world) for rank in ranks}

    for rank, (local, meta_fp32, mesh, (split_local, split_full)) in results.items():
        assert meta_fp32, rank  # sharding allocated nothing
        assert mesh == ("shard", "tp"), rank
        assert split_local * dp * tp == split_full, rank
        assert local <= held / dp * 1.001, (rank, local, held / dp)  # dim-0 padding at most
        assert local * STATE_BYTES_PER_ELEMENT <= plan.parameters + plan.gradients + plan.optimizer_state, rank
    for t, column in dp_columns.items():
        # the dp ranks of one tp rank hold exactly what the planner gives that tp rank: nothing lost or duplicated
        assert sum(results[rank][0] for rank in column) == held, t


def _stages_on_rank(model, config, steps, rank, world_size):
    """What PipelineWrapper leaves rank `rank`: (its stages, its mesh's names, the placeholder units' names,
    {parameter: (local numel, full numel, mesh names, whether split over tp)}, whether all shards stay fp32 on meta,
    the schedule built)."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        wrapper = PipelineWrapper(copy.deepcopy(model), config, steps=steps)
        part = wrapper.setup(rank, world_size)
        modules = dict(part.named_modules())
        units = [unit.name for stage in stage_plan(model.cfg, steps.seq_len, wrapper.layout.pp,
                                                   wrapper.layout.stages_per_rank, wrapper.layout.tp)
                 for unit in stage.units]
        params = {name: (p.to_local().numel(), p.numel(), p.device_mesh.mesh_dim_names, p.placements[-1].is_shard())
                  for name, p in part.named_parameters()}
        return (
            [stage.index for stage in wrapper.stages],
            wrapper.mesh.mesh_dim_names,
            sorted(name for name in units if isinstance(modules[name], nn.Identity)),
            params,
            all(p.to_local().is_meta and p.dtype == torch.float32 for p in part.parameters()),
            type(wrapper.schedule).__name__,
        )
    finally:
        dist.destroy_process_group()


def test_planned_pipeline_layout_holds_its_stages_within_the_planners_figure(monkeypatch):
    """70b on 8 nodes x 8 GPUs of 48 GiB, 2 micro-batches per step: the planner picks tp8 x pp4 (dp 2), as
    test_memory.py shows; every pipeline rank's tp ranks 0 and 7 at dp ranks 0 and 1 build their part."""
    world = 8 * GPUS_PER_NODE
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(GPUS_PER_NODE))
    job = TrainerConfig.from_dict({
        "model": {"preset": "70b"},
        "training": {"micro_batch_size": 1, "seq_len": SEQ_LEN},
        "distributed": {"strategy": "auto", "mixed_precision_policy": "bf16", "gradient_accumulation_steps": 2},
    })
    config = resolve_distributed(job, world, PIPELINE_DEVICE_MEMORY, ranks_per_node=GPUS_PER_NODE)
    assert (config.strategy, config.tp, config.pp, config.pipeline_schedule) == ("fsdp", 8, 4, "1f1b")
    layout = Layout(world_size=world, tp=config.tp, pp=config.pp)
    assert layout.dp == 2
    micro_batches = config.gradient_accumulation_steps
    plan = functools.partial(plan_memory, "70b", config.strategy, fsdp_sharding=config.fsdp_sharding,
                             precision=config.mixed_precision_policy, micro_batch_size=1, seq_len=SEQ_LEN,
                             world_size=world, activation_checkpointing=config.activation_checkpointing,
                             tensor_parallel=layout.tp, pipeline_parallel=layout.pp, micro_batches=micro_batches)
    plans, fullest = {r: plan(pipeline_rank=r) for r in range(layout.pp)}, plan()
    assert fullest.fits(PIPELINE_DEVICE_MEMORY) and fullest == plans[fullest.pipeline_rank]
    assert sum(plan.held_params for plan in plans.values()) == sum(wrap_unit_params(MODEL_PRESETS["70b"], layout.tp))

    with torch.device("meta"):
        model = BrainAI.from_preset("70b")
    steps = StepSettings(seq_len=SEQ_LEN, micro_batches=micro_batches, loss_fn=loss_fn)
    # ranks are numbered pp-outermost, tp-innermost: rank = (pp_rank x dp + dp_rank) x tp + tp_rank
    examined = {(p, d, t): (p * layout.dp + d) * layout.tp + t
                for p in range(layout.pp) for d in range(layout.dp) for t in (0, layout.tp - 1)}
    results = {key: _stages_on_rank(model, config, steps, rank, world) for key, rank in examined.items()}

    cut = stage_plan(model.cfg, SEQ_LEN, layout.pp, 1, layout.tp)
    units = [unit.name for stage in cut for unit in stage.units]
    for (p, d, t), (stages, mesh, placeholders, params, meta_fp32, schedule) in results.items():
        key, plan = (p, d, t), plans[p]
        assert stages == [p] and mesh == ("pp", "shard", "tp") and schedule == "Schedule1F1B", key
        assert meta_fp32, key  # building the rank's part allocated nothing
        kept = [name for name in units if name not in placeholders]
        assert tuple(kept) == cut[p].names, key  # the other ranks' units are parameterless placeholders
        # every parameter belongs to a kept unit; every kept unit holds parameters
        owners = {next((unit for unit in kept if name.startswith(f"{unit}.")), None) for name in params}
        assert owners == set(kept), key
        assert {m for _, _, m, _ in params.values()} <= {("shard",), ("shard", "tp")}, key
        split = [(local, full) for local, full, m, on_tp in params.values() if m == ("shard", "tp") and on_tp]
        assert split and all(local * layout.dp * layout.tp == full for local, full in split), key
        local = sum(n for n, _, _, _ in params.values())
        assert local * STATE_BYTES_PER_ELEMENT <= plan.parameters + plan.gradients + plan.optimizer_state, key
    for (p, t) in {(p, t) for p, _, t in examined}:
        # the dp ranks of one (pipeline, tp) rank hold exactly what the planner gives that pipeline rank
        assert sum(sum(n for n, _, _, _ in results[(p, d, t)][3].values()) for d in range(layout.dp)) \
            == plans[p].held_params, (p, t)
