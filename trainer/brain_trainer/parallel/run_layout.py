"""The run's layout, built once per run and passed down: where this process sits (rank, world, ranks per node,
device), the resolved distributed settings, the checked `Layout` (pp x dp x tp) and the DeviceMesh over it.

The loop builds it once (`RunLayout.resolved`) and hands it to the wrapper
(DDP, FSDP2, tensor and pipeline parallelism take their mesh dimensions from
it), the data loader (which batches this rank reads) and the out-of-memory
path (the planner's estimate for this layout). LOCAL_WORLD_SIZE is read here
and nowhere else; a wrapper set up without a layout builds its own here from
the environment.

The mesh is ("pp", dp..., "tp"), the pipeline and tensor dimensions present
only when above 1, pp outermost and tp innermost as `Layout` numbers the ranks.
Its data-parallel dimensions are FSDP2's (`mesh_shape`). It is created on
first use: only FSDP2 and the pipeline need one (DDP and a single process use
the default process group).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Mapping, Optional

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..config import DistributedConfig, TrainerConfig
from ..plan import rank_estimate, resolve_distributed
from ..plan.layout import Layout, bubble_fraction, build_layout, micro_batch_problems, micro_batches_field
from ..schema import ConfigError, FieldError
from .launcher import env_int

log = logging.getLogger(__name__)

PP_DIM, TP_DIM = "pp", "tp"
Dims = tuple[tuple[int, ...], tuple[str, ...]]  # a mesh's (shape, dimension names)


def local_world_size(world_size: int, environ: Optional[Mapping[str, str]] = None) -> int:
    """Ranks per node: LOCAL_WORLD_SIZE as the launcher exported it; unset, one node holds the world."""
    return env_int(os.environ if environ is None else environ, "LOCAL_WORLD_SIZE", default=world_size, minimum=1)


@dataclass(frozen=True)
class Ranks:
    """Where this process sits in the world."""

    rank: int
    world_size: int
    local_world_size: int  # ranks per node

    @classmethod
    def from_environment(cls, environ: Optional[Mapping[str, str]] = None) -> "Ranks":
        """RANK, WORLD_SIZE and LOCAL_WORLD_SIZE, as `DistributedLauncher` exported them."""
        env = os.environ if environ is None else environ
        world_size = env_int(env, "WORLD_SIZE", minimum=1)
        return cls(env_int(env, "RANK"), world_size, local_world_size(world_size, env))


def mesh_shape(sharding: str, world_size: int, local_world_size: int) -> Dims:
    """FSDP2's data-parallel mesh (shape, dimension names) for a sharding strategy over `world_size` ranks."""
    if world_size < 1:
        raise ValueError(f"world_size: must be >= 1, got {world_size}")
    if sharding in ("full_shard", "shard_grad_op"):
        return (world_size,), ("shard",)
    if sharding == "no_shard":
        return (world_size, 1), ("replicate", "shard")
    if sharding == "hybrid_shard":
        if local_world_size < 1 or world_size % local_world_size:
            raise ValueError(
                f"LOCAL_WORLD_SIZE: hybrid_shard needs a divisor of world size {world_size}, got {local_world_size}"
            )
        return (world_size // local_world_size, local_world_size), ("replicate", "shard")
    raise ValueError(f"distributed.fsdp_sharding: unknown strategy {sharding!r}")


def device_memory_bytes(device: torch.device) -> Optional[int]:
    """Accelerator memory for the planner; None on CPU, where host memory is shared and unknown."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return None


def resolve_strategy(cfg: TrainerConfig, ranks: Ranks, device: torch.device) -> DistributedConfig:
    """The distributed settings with `strategy: auto` replaced by the planner's choice (tensor parallelism, when the
    job leaves it unset, within this node's ranks)."""
    resolved = resolve_distributed(cfg, ranks.world_size, device_memory_bytes(device), ranks.local_world_size)
    if resolved.strategy == "single" and ranks.world_size > 1:
        raise ConfigError([FieldError(
            "distributed.strategy", f"single trains one process, but the world size is {ranks.world_size}; use ddp or fsdp")])
    return resolved


def check_micro_batches(cfg: TrainerConfig, dist_cfg: DistributedConfig, micro_batches: int) -> None:
    """Refuse fewer micro-batches per step than the pipeline needs (ConfigError naming the field that sets them);
    warn when the pipeline idles much of a step for want of them."""
    field = micro_batches_field(cfg.training.global_batch_size)
    problems = list(micro_batch_problems(dist_cfg, micro_batches, field, str))
    if problems:
        raise ConfigError([FieldError(path, message) for path, message in problems])
    if 1 < dist_cfg.pp and micro_batches < 4 * dist_cfg.pp:
        log.warning("%s gives %d micro-batches per step for %d pipeline stages: each rank idles %.0f%% of a step "
                    "(fill and drain); at least %d keep it small", field, micro_batches, dist_cfg.pp,
                    100 * bubble_fraction(dist_cfg, micro_batches), 4 * dist_cfg.pp)


@dataclass(frozen=True)
class RunLayout:
    """This run's parallel layout: built once, read by every piece that depends on it."""

    ranks: Ranks
    device: torch.device  # this rank's (parallel.ddp.use_local_device)
    distributed: DistributedConfig  # resolved: a concrete strategy, tensor and pipeline degrees
    layout: Layout  # pp x dp x tp, checked against the world

    @classmethod
    def of(cls, distributed: DistributedConfig, ranks: Ranks, device: torch.device) -> "RunLayout":
        """The layout of `distributed` over `ranks`; ConfigError naming the field when it does not fit."""
        return cls(ranks, device, distributed, build_layout(distributed, ranks.world_size, ranks.local_world_size))

    @classmethod
    def from_environment(cls, distributed: DistributedConfig, rank: int, world_size: int,
                         device: torch.device) -> "RunLayout":
        """The layout of a process set up without one (a wrapper on its own): ranks per node from the environment."""
        return cls.of(distributed, Ranks(rank, world_size, local_world_size(world_size)), device)

    @classmethod
    def resolved(cls, cfg: TrainerConfig, ranks: Ranks, device: torch.device) -> "RunLayout":
        """The training's layout: `strategy: auto` resolved by the planner, the pipeline's micro-batches checked."""
        distributed = resolve_strategy(cfg, ranks, device)
        run = cls.of(distributed, ranks, device)
        check_micro_batches(cfg, distributed, run.micro_batches(cfg))
        return run

    @property
    def rank(self) -> int:
        return self.ranks.rank

    @property
    def world_size(self) -> int:
        return self.ranks.world_size

    def micro_batches(self, cfg: TrainerConfig) -> int:
        """Micro-batches per optimizer step (the accumulation steps) at this layout."""
        return replace(cfg, distributed=self.distributed).accumulation_steps(self.world_size)

    @property
    def dp_dims(self) -> Dims:
        """The mesh's data-parallel dimensions: FSDP2's over the dp ranks, in nodes of local_world_size / tp."""
        return mesh_shape(self.distributed.fsdp_sharding, self.layout.dp,
                          max(self.ranks.local_world_size // self.layout.tp, 1))

    @cached_property
    def mesh(self) -> DeviceMesh:
        """The whole mesh ("pp", dp..., "tp"), created on first use (every rank asks at the same point)."""
        (dp_shape, dp_names), layout = self.dp_dims, self.layout
        pp = ((layout.pp,), (PP_DIM,)) if layout.pp > 1 else ((), ())
        tp = ((layout.tp,), (TP_DIM,)) if layout.tp > 1 else ((), ())
        return init_device_mesh(self.device.type, (*pp[0], *dp_shape, *tp[0]),
                                mesh_dim_names=(*pp[1], *dp_names, *tp[1]))

    @property
    def dp_mesh(self) -> DeviceMesh:
        """The data-parallel part of the mesh, which FSDP2 shards over."""
        names = self.dp_dims[1]
        return self.mesh if self.mesh.mesh_dim_names == names else self.mesh[names]

    @property
    def tp_mesh(self) -> DeviceMesh:
        return self.mesh[TP_DIM]

    @property
    def pp_group(self) -> dist.ProcessGroup:
        """This rank's pipeline: one rank per stage group, all holding this rank's dp and tp coordinates."""
        return self.mesh.get_group(PP_DIM)

    @property
    def dp_rank(self) -> int:
        """Which batches this rank reads, of `layout.dp`: the tp ranks of a group and a pipeline's stages share."""
        return self.layout.dp_rank(self.rank)

    def memory_estimate(self, cfg: TrainerConfig) -> Optional[int]:
        """The planner's bytes per rank at this layout (device memory on an accelerator, else host memory)."""
        return rank_estimate(cfg, self.distributed, self.world_size, node_size=self.ranks.local_world_size,
                             accelerator=self.device.type == "cuda")
