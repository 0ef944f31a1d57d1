"""The parallel layout: how the world of ranks splits into tensor-parallel groups and data-parallel replicas.

Torch-free, so the operator's validation, `braintrain validate` and the
trainer at start-up refuse the same layouts with the same lines. One value,
built once per run and checked against the world:

    world = dp x tp        tp ranks split each reasoning/decision block's matmuls (tensor.py);
                           dp = what is left, sharded or replicated as strategy/fsdpSharding say

Ranks are numbered tp-innermost (a DeviceMesh is row-major): the tp ranks of a
group are consecutive, so a group that divides the ranks of a node stays in
that node (TP's all-reduces per block want NVLink, not the network).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ..config import DistributedConfig
from ..schema import ConfigError, FieldError, Names

@dataclass(frozen=True)
class Layout:
    """Ranks per parallel dimension, checked: tp divides the ranks of a node and the world."""

    world_size: int
    tp: int = 1

    @property
    def dp(self) -> int:
        """Data-parallel replicas: the ranks that read different batches."""
        return self.world_size // self.tp

    def dp_rank(self, rank: int) -> int:
        """Which batch `rank` reads: the tp ranks of one group read the same one."""
        return rank // self.tp

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp


def spread_problems(distributed: DistributedConfig, ranks_per_node: int, ranks_per_node_field: str,
                    name: Names) -> Iterator[tuple[str, str]]:
    """What is wrong with spreading `distributed.tensor_parallel` over nodes of `ranks_per_node` ranks each.

    Every world of whole nodes then divides too, so an elastic range keeps the
    layout valid at every size within it."""
    tp = distributed.tp
    if ranks_per_node % tp:
        yield (
            "distributed.tensor_parallel",
            f"{tp} does not divide {name(ranks_per_node_field)} {ranks_per_node} (a tensor-parallel group stays in a node)",
        )


def build_layout(distributed: DistributedConfig, world_size: int, local_world_size: int) -> Layout:
    """The layout of this run's world; ConfigError naming the field when it cannot be built."""
    problems = list(spread_problems(distributed, local_world_size, "LOCAL_WORLD_SIZE", str))
    if not problems and world_size % distributed.tp:
        problems.append(("distributed.tensor_parallel", f"{distributed.tp} does not divide the world size {world_size}"))
    if problems:
        raise ConfigError([FieldError(path, message) for path, message in problems])
    return Layout(world_size=world_size, tp=distributed.tp)
