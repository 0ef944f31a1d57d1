import torch
import torch.distributed as dist

from harness import run_ranks


def _sum_ranks(rank, world_size):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item()


def test_two_gloo_ranks_all_reduce():
    assert run_ranks(_sum_ranks, 2) == [1.0, 1.0]
