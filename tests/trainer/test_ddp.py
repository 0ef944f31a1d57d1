"""DDPWrapper on real gloo ranks: loss parity with one process, exact metric means, group ownership."""

import hashlib
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from brain_trainer import DDPWrapper, DistributedConfig
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


def _ddp_rank(rank, world_size):
    """One spawn, several checks: every rank returns what rank 0's assertions need."""
    batches = global_batches(STEPS, MICRO_BATCH * world_size)
    wrapper = DDPWrapper(minimal_model(), DistributedConfig(strategy="ddp"))
    model = wrapper.setup(rank, world_size)
    optimizer = optimizer_for(model)
    losses = []
    for tokens in batches:
        loss = lm_loss(model, rank_slice(tokens, rank, world_size))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(wrapper.all_reduce_metrics({"loss": loss.item()})["loss"])

    # values that are not exactly representable in float32: the mean must be float64-exact
    mine = {"b": 0.1 + rank / 3, "a": -7.25 * (rank + 1), "tokens": 1e12 + rank}
    # keys in a different insertion order on each rank must still line up
    ordered = dict(reversed(mine.items())) if rank else mine
    mean = wrapper.all_reduce_metrics(ordered)

    try:
        wrapper.setup(rank + 1, world_size)
        mismatch = None
    except ValueError as exc:
        mismatch = str(exc)
    wrapper.cleanup()  # the harness created the group, so it must survive
    return dict(
        losses=losses,
        mine=mine,
        mean=mean,
        wrapped=isinstance(model, DistributedDataParallel),
        group_alive=dist.is_initialized(),
        mismatch=mismatch,
        params=hashlib.sha256(torch.cat([p.detach().flatten() for p in model.module.parameters()]).numpy()).hexdigest(),
    )


def test_two_ranks_match_one_process_and_reduce_metrics_exactly():
    results = run_ranks(_ddp_rank, 2)
    reference = reference_losses(global_batches(STEPS, MICRO_BATCH * 2))
    first = results[0]
    assert first["wrapped"] and first["group_alive"]
    assert reference[-1] < reference[0]  # the model trains, so parity compares moving numbers
    assert max_abs_diff(first["losses"], reference) <= 1e-5
    assert first["losses"] == results[1]["losses"]
    # DDP keeps replicas identical
    assert first["params"] == results[1]["params"]
    expected = {key: (results[0]["mine"][key] + results[1]["mine"][key]) / 2 for key in first["mine"]}
    assert first["mean"] == expected and results[1]["mean"] == expected
    assert "disagrees with the existing process group (rank 0 of 2)" in first["mismatch"]


class _WithBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(3, 4)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.norm(self.layer(x))


def test_setup_creates_and_cleanup_destroys_its_own_group(monkeypatch):
    """Without a group, setup creates one and cleanup tears it down again. A group of one rendezvouses with
    nobody: no MASTER_ADDR or MASTER_PORT, no port bound (env:// would need both and start a TCPStore server)."""
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    assert not dist.is_initialized()
    timeouts = []
    init = dist.init_process_group

    def spy(*args, **kwargs):
        timeouts.append(kwargs.get("timeout"))
        return init(*args, **kwargs)

    monkeypatch.setattr(dist, "init_process_group", spy)
    wrapper = DDPWrapper(_WithBatchNorm(), DistributedConfig(strategy="ddp", backend="auto", timeout_seconds=123))
    try:
        model = wrapper.setup(0, 1)
        assert dist.get_backend() == "gloo"  # auto on a CPU machine
        assert timeouts == [timedelta(seconds=123)], "distributed.timeout_seconds reaches the process group"
        # SyncBatchNorm cannot run on CPU, so the BatchNorm stays and the model still trains
        assert type(model.module.norm) is nn.BatchNorm1d
        model(torch.randn(5, 3)).sum().backward()
        assert wrapper.all_reduce_metrics({"x": 2.5}) == {"x": 2.5}
    finally:
        wrapper.cleanup()
    assert not dist.is_initialized()


def test_setup_rejects_a_rank_outside_the_world():
    with pytest.raises(ValueError, match=r"rank: must be in \[0, world_size=2\), got 2"):
        DDPWrapper(nn.Linear(1, 1), DistributedConfig()).setup(2, 2)
    assert not dist.is_initialized()


def test_metrics_without_a_group_are_their_own_mean():
    wrapper = DDPWrapper(nn.Linear(1, 1), DistributedConfig())
    assert wrapper.all_reduce_metrics({"loss": 3, "lr": torch.tensor(0.5)}) == {"loss": 3.0, "lr": 0.5}
    with pytest.raises(ValueError, match=r"metrics\['loss'\]: must be a number, got 'low'"):
        wrapper.all_reduce_metrics({"loss": "low"})
