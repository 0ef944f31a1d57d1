"""The 13b and 70b presets split and sharded as planned (tp x dp), without a cluster.

Like the 7b proof (test_fsdp_scale.py): the `fake` process group lets one
process act as any rank of a large world, and the meta device gives the
parameters shapes but no storage, so FSDPWrapper builds the real 2-D mesh
(dp x tp), splits the real blocks over tp and shards over dp exactly as on a
cluster. The layout comes from the planner (`resolve_distributed`, as the
trainer resolves `strategy: auto`), and every rank's shards stay within the
planner's per-rank figure. Each rank examined gets a copy of one meta model:
nothing is ever allocated.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from brain_trainer import BrainAI, FSDPWrapper, TrainerConfig
from brain_trainer.config.presets import MODEL_PRESETS, param_count, wrap_unit_params
from brain_trainer.parallel.memory import GIB, plan_memory, resolve_distributed

GPUS_PER_NODE = 8
DEVICE_MEMORY = 80 * GIB
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
