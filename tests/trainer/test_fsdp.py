"""FSDPWrapper (FSDP2) on real gloo ranks: loss parity with one process for every strategy, checkpoints."""

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from brain_trainer import DistributedConfig, FSDPWrapper
from brain_trainer.parallel.blocks import block_names, checkpointed_blocks
from brain_trainer.parallel.ddp import all_reduce_mean
from brain_trainer.parallel.fsdp import ShardingPolicy, mesh_shape, unit_names
from harness import run_ranks
from parity import (
    STEPS,
    global_batches,
    lm_loss,
    max_abs_diff,
    minimal_model,
    optimizer_for,
    rank_slice,
    reference_losses,
)

MICRO_BATCH = 2

# Every strategy, and each of the optional features riding along with one of them.
CASES = {
    "full_shard": dict(fsdp_sharding="full_shard"),
    "shard_grad_op": dict(fsdp_sharding="shard_grad_op"),
    "hybrid_shard+checkpointing": dict(fsdp_sharding="hybrid_shard", activation_checkpointing="selective"),
    "no_shard+cpu_offload": dict(fsdp_sharding="no_shard", cpu_offload=True),
}


def _local_numel(model):
    return sum(p.to_local().numel() for p in model.parameters())


def _train(rank, world_size, settings):
    """Train STEPS steps; returns (what the test checks, the wrapper, the optimizer)."""
    wrapper = FSDPWrapper(minimal_model(), DistributedConfig(strategy="fsdp", **settings))
    model = wrapper.setup(rank, world_size)
    optimizer = optimizer_for(model)
    losses = []
    for tokens in global_batches(STEPS, MICRO_BATCH * world_size):
        loss = lm_loss(model, rank_slice(tokens, rank, world_size))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(all_reduce_mean({"loss": loss.item()})["loss"])
    wrapper.cleanup()  # the harness owns the group: nothing to destroy
    summary = dict(
        losses=losses,
        local_numel=_local_numel(model),
        all_dtensor=all(isinstance(p, DTensor) for p in model.parameters()),
        fsdp_units=sum(isinstance(m, FSDPModule) for m in model.modules()),
        policy=wrapper.get_sharding_policy(),
    )
    return summary, wrapper, optimizer


def _round_trip(rank, world_size, trained, optimizer, folder):
    """Save a full_shard model, load it into a differently initialised no_shard one: same outputs."""
    tokens = rank_slice(global_batches(1, MICRO_BATCH * world_size, seed=1)[0], rank, world_size)
    trained.save_distributed_checkpoint(folder, optimizer=optimizer)
    fresh = FSDPWrapper(minimal_model(seed=1), DistributedConfig(strategy="fsdp", fsdp_sharding="no_shard"))
    model = fresh.setup(rank, world_size)
    with torch.no_grad():
        before = lm_loss(model, tokens).item()
        fresh.load_distributed_checkpoint(folder, optimizer=optimizer_for(model))
        return dict(expected=lm_loss(trained.wrapped, tokens).item(), restored=lm_loss(model, tokens).item(),
                    before=before)  # fmt: skip


def _bf16_step(rank, world_size):
    """bf16 compute and all-gather, fp32 sharded parameters and gradients."""
    model = FSDPWrapper(minimal_model(), DistributedConfig(strategy="fsdp", mixed_precision_policy="bf16")).setup(
        rank, world_size
    )
    tokens = rank_slice(global_batches(1, MICRO_BATCH * world_size)[0], rank, world_size)
    logits = model(tokens[:, :-1])
    logits.float().sum().backward()
    return dict(
        logits=logits.dtype,
        params={p.dtype for p in model.parameters()},
        grads={p.grad.dtype for p in model.parameters()},
    )


def _fsdp_rank(rank, world_size, folder):
    cases, trained = {}, {}
    for name, settings in CASES.items():
        cases[name], *trained[name] = _train(rank, world_size, settings)
    return dict(cases=cases, bf16=_bf16_step(rank, world_size),
                checkpoint=_round_trip(rank, world_size, *trained["full_shard"], folder))  # fmt: skip


def test_every_strategy_matches_one_process_and_checkpoints_round_trip(tmp_path):
    results = run_ranks(_fsdp_rank, 2, str(tmp_path / "step-00000005"))
    reference = reference_losses(global_batches(STEPS, MICRO_BATCH * 2))
    assert reference[-1] < reference[0]
    total = sum(p.numel() for p in minimal_model().parameters())
    units = len(minimal_model().wrap_units())
    for name in CASES:
        ranks = [r["cases"][name] for r in results]
        assert max_abs_diff(ranks[0]["losses"], reference) <= 1e-5, (name, ranks[0]["losses"], reference)
        assert ranks[0]["losses"] == ranks[1]["losses"], name
        assert all(r["all_dtensor"] and r["fsdp_units"] == units + 1 for r in ranks), name
        local = [r["local_numel"] for r in ranks]
        if name.startswith("no_shard"):
            assert local == [total, total], name  # replicated
        else:
            assert sum(local) == total and max(local) <= total // 2 + 2048, (name, local)  # halved, up to padding
    policies = {name: results[0]["cases"][name]["policy"] for name in CASES}
    assert policies["full_shard"].reshard_after_forward and not policies["shard_grad_op"].reshard_after_forward
    assert policies["hybrid_shard+checkpointing"].mesh_shape == (1, 2)  # both ranks on one "node"
    assert policies["hybrid_shard+checkpointing"].checkpointed
    assert policies["no_shard+cpu_offload"].mesh_shape == (2, 1) and policies["no_shard+cpu_offload"].cpu_offload
    for r in results:
        assert r["bf16"] == dict(logits=torch.bfloat16, params={torch.float32}, grads={torch.float32})
        restored = r["checkpoint"]
        assert abs(restored["restored"] - restored["expected"]) <= 1e-6, restored
        assert abs(restored["before"] - restored["expected"]) > 1e-3, restored  # the load changed the model


def test_mesh_shapes():
    assert mesh_shape("full_shard", 8, 4) == ((8,), ("shard",))
    assert mesh_shape("shard_grad_op", 8, 4) == ((8,), ("shard",))
    assert mesh_shape("hybrid_shard", 8, 4) == ((2, 4), ("replicate", "shard"))
    assert mesh_shape("no_shard", 8, 4) == ((8, 1), ("replicate", "shard"))
    with pytest.raises(ValueError, match=r"LOCAL_WORLD_SIZE: hybrid_shard needs a divisor of world size 8, got 3"):
        mesh_shape("hybrid_shard", 8, 3)
    with pytest.raises(ValueError, match=r"distributed.fsdp_sharding: unknown strategy 'zero3'"):
        mesh_shape("zero3", 8, 4)


def test_units_follow_wrap_units_innermost_first():
    names = unit_names(minimal_model())
    assert names[:3] == ("snn_core.blocks.0", "htm.blocks.0", "workspace.blocks.0")
    assert names[-3:] == ("decision", "meta", "heads")
    assert all(names.index(f"{stack}.blocks.0") < names.index(stack) for stack in ("snn_core", "reasoning"))
    # checkpoint the blocks, not the stacks around them (each activation recomputed once), in forward order
    blocks = block_names(minimal_model())
    assert blocks[0] == "encoders" and blocks[-2:] == ("meta", "heads") and "reasoning" not in blocks
    assert blocks.index("reasoning.blocks.0") < blocks.index("reasoning.blocks.1") < blocks.index("decision.blocks.0")
    assert checkpointed_blocks(blocks, "full", 2) == blocks and checkpointed_blocks(blocks, "none", 2) == ()
    assert checkpointed_blocks(blocks, "selective", 3) == blocks[2::3]


def test_units_default_to_children_with_parameters():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Sequential(nn.Linear(2, 2)))
    assert unit_names(model) == ("0", "2")


def test_wrap_units_must_belong_to_the_model():
    class Stray(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(2, 2)

        def wrap_units(self):
            return [nn.Linear(2, 2)]

    with pytest.raises(ValueError, match=r"not submodules of the model: \['Linear'\]"):
        unit_names(Stray())


def test_policy_without_a_group_uses_the_given_world_size(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    config = DistributedConfig(strategy="fsdp", fsdp_sharding="hybrid_shard", mixed_precision_policy="bf16")
    policy = FSDPWrapper(minimal_model(), config).get_sharding_policy(16)
    assert isinstance(policy, ShardingPolicy)
    assert (policy.mesh_shape, policy.shard_size) == ((4, 4), 4)
    assert (policy.param_dtype, policy.reduce_dtype) == ("bf16", "fp32")
    assert policy.checkpointed == () and not policy.cpu_offload
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "four")
    with pytest.raises(ValueError, match=r"LOCAL_WORLD_SIZE: must be an integer, got 'four'"):
        FSDPWrapper(minimal_model(), config).get_sharding_policy(16)


def test_policy_needs_a_world_size():
    with pytest.raises(RuntimeError, match=r"needs world_size= or an initialised process group"):
        FSDPWrapper(minimal_model(), DistributedConfig()).get_sharding_policy()


def test_checkpointing_before_setup_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match=r"setup\(\) must run before checkpointing"):
        FSDPWrapper(minimal_model(), DistributedConfig()).save_distributed_checkpoint(str(tmp_path))
