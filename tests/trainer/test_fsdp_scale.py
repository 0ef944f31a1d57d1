"""The 7b preset sharded full_shard over 8 ranks, without 8 GPUs.

The `fake` process group lets one process act as any rank of a large world
(collectives return without communicating), and the meta device gives the
parameters shapes but no storage, so FSDPWrapper shards the real 7B module
tree exactly as it would on a cluster.
"""

import math

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from brain_trainer import BrainAI, DistributedConfig, FSDPWrapper
from brain_trainer.config.presets import param_count

WORLD_SIZE = 8


def _shard_on_rank(rank):
    """(local parameter elements, every local shard on meta and in fp32, policy) for one rank."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD_SIZE)
    try:
        with torch.device("meta"):
            model = BrainAI.from_preset("7b")
        wrapper = FSDPWrapper(model, DistributedConfig.preset("7b"))
        sharded = wrapper.setup(rank, WORLD_SIZE)
        shards = [p.to_local() for p in sharded.parameters()]
        return (
            sum(s.numel() for s in shards),
            all(s.is_meta and s.dtype == torch.float32 for s in shards),
            wrapper.get_sharding_policy(),
        )
    finally:
        dist.destroy_process_group()


def test_7b_full_shard_over_8_ranks_holds_an_eighth_per_rank():
    with torch.device("meta"):
        full = BrainAI.from_preset("7b")
    shapes = [p.shape for p in full.parameters()]
    total = sum(math.prod(s) for s in shapes)
    assert total == param_count("7b")
    # dim-0 sharding pads each parameter to a multiple of the world size: the most a rank can hold
    bound = sum(math.ceil(s[0] / WORLD_SIZE) * math.prod(s[1:]) for s in shapes)
    assert bound <= total / WORLD_SIZE * 1.001

    results = [_shard_on_rank(rank) for rank in range(WORLD_SIZE)]
    local = [numel for numel, _, _ in results]
    assert all(numel <= bound for numel in local), (local, bound)
    assert sum(local) == total  # nothing duplicated, nothing lost
    assert all(meta_fp32 for _, meta_fp32, _ in results)  # sharding allocated nothing
    policy = results[0][2]
    assert policy.mesh_shape == (WORLD_SIZE,) and policy.reshard_after_forward
    assert policy.param_dtype == "bf16" and policy.reduce_dtype == "fp32" and policy.checkpointed
