"""The run's layout (parallel/run_layout.py): the launcher's variables read once, the layout checked, the mesh
built once and handed to the wrappers, which then read no LOCAL_WORLD_SIZE of their own; and a wrapper's
`train_step` trains as the seed's GradientAccumulator loop does."""

from __future__ import annotations

import os

import pytest
import torch

from brain_trainer import DDPWrapper, DistributedConfig, FSDPWrapper, GradientAccumulator
from brain_trainer.loop.loss import loss_fn
from brain_trainer.parallel.run_layout import Ranks, RunLayout
from brain_trainer.parallel.step import StepSettings
from brain_trainer.schema import ConfigError
from harness import run_ranks
from parity import SEQ_LEN, global_batches, minimal_model, optimizer_for, rank_slice

CPU = torch.device("cpu")
MICRO_BATCH, MICRO_BATCHES, STEPS = 2, 3, 2


def test_ranks_are_the_launchers_variables():
    assert Ranks.from_environment({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}) == Ranks(3, 8, 4)
    assert Ranks.from_environment({"RANK": "0", "WORLD_SIZE": "8"}).local_world_size == 8  # unset: one node
    with pytest.raises(ConfigError) as exc:
        Ranks.from_environment({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "two"})
    assert exc.value.errors[0].path == "LOCAL_WORLD_SIZE"


def test_the_mesh_dimensions_follow_the_layout():
    config = DistributedConfig(strategy="fsdp", tensor_parallel=2, pipeline_parallel=2, fsdp_sharding="hybrid_shard")
    run = RunLayout.of(config.resolved(), Ranks(5, 16, 8), CPU)
    assert (run.layout.pp, run.layout.dp, run.layout.tp) == (2, 4, 2)
    # hybrid_shard's nodes hold local_world_size / tp data-parallel ranks: 4, so one node's worth of dp ranks
    assert run.dp_dims == ((1, 4), ("replicate", "shard"))
    assert run.dp_rank == run.layout.dp_rank(5) == 2
    with pytest.raises(ConfigError) as exc:
        RunLayout.of(DistributedConfig(strategy="fsdp", tensor_parallel=3).resolved(), Ranks(0, 6, 4), CPU)
    assert exc.value.errors[0].path == "distributed.tensor_parallel"


def _given_layout(rank: int, world_size: int) -> dict:
    """An FSDP2 wrapper with tensor parallelism, handed the run's layout: its mesh is the layout's."""
    config = DistributedConfig(strategy="fsdp", tensor_parallel=2).resolved()
    run = RunLayout.from_environment(config, rank, world_size, CPU)
    os.environ["LOCAL_WORLD_SIZE"] = "not a number"  # read once, above: nothing after may read it again
    wrapper = FSDPWrapper(minimal_model(), config, run_layout=run)
    wrapper.setup(rank, world_size)
    return dict(same_mesh=wrapper.mesh is run.mesh, dims=wrapper.mesh.mesh_dim_names,
                shard_size=wrapper.get_sharding_policy().shard_size)


def _micro_batches(rank: int, world_size: int):
    for tokens in global_batches(STEPS, MICRO_BATCH * MICRO_BATCHES * world_size):
        for micro in rank_slice(tokens, rank, world_size).split(MICRO_BATCH):
            yield micro[:, :-1], micro[:, 1:]


def _stepped(rank: int, world_size: int) -> dict:
    """The same DDP training twice: the seed's accumulation loop, then the wrapper's train_step."""
    config = DistributedConfig(strategy="ddp")
    model = DDPWrapper(minimal_model(), config).setup(rank, world_size)
    optimizer, accumulator = optimizer_for(model), GradientAccumulator(MICRO_BATCHES, model=model)
    seed_losses = []
    for micro_idx, (x, y) in enumerate(_micro_batches(rank, world_size)):
        with accumulator.sync_context(micro_idx % MICRO_BATCHES):
            loss = loss_fn(model(x), y)
            accumulator.step(loss, optimizer, micro_idx % MICRO_BATCHES)
        seed_losses.append(loss.item())

    wrapper = DDPWrapper(minimal_model(), config, steps=StepSettings(SEQ_LEN, MICRO_BATCHES, loss_fn))
    stepped = wrapper.setup(rank, world_size)
    optimizer, accumulator = optimizer_for(stepped), GradientAccumulator(MICRO_BATCHES, model=stepped)
    batches, losses, counted = _micro_batches(rank, world_size), torch.zeros(()), 0
    for _ in range(STEPS):
        counted += wrapper.train_step(batches, accumulator, losses)
        accumulator.apply(optimizer)
    return dict(same=all(torch.equal(a, b) for a, b in zip(model.parameters(), stepped.parameters())),
                seed_loss=sum(seed_losses), loss=losses.item(), counted=counted)


def test_wrappers_take_the_run_layout_and_its_mesh():
    for result in run_ranks(_given_layout, 2):
        assert result == dict(same_mesh=True, dims=("shard", "tp"), shard_size=1)


def test_train_step_trains_as_the_seeds_accumulation_loop():
    for result in run_ranks(_stepped, 2):
        assert result["same"] and result["counted"] == STEPS * MICRO_BATCHES
        assert result["loss"] == pytest.approx(result["seed_loss"], rel=1e-5)
