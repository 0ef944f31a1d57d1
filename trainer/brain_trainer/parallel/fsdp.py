"""Fully sharded data parallelism with FSDP2 (`torch.distributed.fsdp.fully_shard`).

Each wrap unit (the model's `wrap_units()`, else each top-level child that has
parameters) becomes one FSDP parameter group: its parameters are all-gathered
together before its forward and its gradients reduce-scattered together after
its backward. The root is sharded last and holds whatever is left.

Strategies, as FSDP2 expresses them (torch 2.13):

    full_shard     1-D mesh over all ranks, reshard_after_forward=True
    shard_grad_op  1-D mesh over all ranks, reshard_after_forward=False
                   (parameters stay gathered from forward to backward)
    hybrid_shard   2-D mesh (nodes, LOCAL_WORLD_SIZE): shard within a node,
                   replicate across nodes (gradients reduce-scattered in the
                   node, then all-reduced across nodes)
    no_shard       2-D mesh (world_size, 1): every rank holds every parameter,
                   gradients are all-reduced - DDP semantics through FSDP2

With distributed.tensor_parallel = tp > 1 the mesh gains a last dimension
"tp" (tp ranks, consecutive); the blocks are split over it first (tensor.py),
and the mesh above is built over world_size / tp data-parallel ranks. The
mesh is the run's (`run_layout.RunLayout.mesh`), built once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.optim import Optimizer

from .. import checkpoint as checkpoints
from ..config import DistributedConfig
from .blocks import Backend
from .ddp import Materialize, ProcessGroupUser
from .run_layout import RunLayout, local_world_size, mesh_shape
from .step import StepSettings
from .tensor import apply_tensor_parallel

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class ShardingPolicy:
    """What FSDPWrapper does to a model, resolved for one world size."""

    units: tuple[str, ...]  # qualified names sharded as their own group, innermost first (the root follows)
    reshard_after_forward: bool
    mesh_shape: tuple[int, ...]  # (shard,) or (replicate, shard)
    mesh_dim_names: tuple[str, ...]
    param_dtype: str  # compute and all-gather precision: fp32, bf16 or fp16
    reduce_dtype: str  # gradient reduction precision
    cpu_offload: bool
    checkpointed: tuple[str, ...]  # blocks whose activations are recomputed in backward
    tensor_parallel: int = 1  # ranks splitting each reasoning/decision block (tensor.py): a last mesh dimension "tp"

    @property
    def shard_size(self) -> int:
        """Ranks one parameter is split over."""
        return self.mesh_shape[-1]


def unit_names(model: nn.Module) -> tuple[str, ...]:
    """Qualified names of the wrap units, ordered innermost first (fully_shard must go bottom-up)."""
    names = {id(module): name for name, module in model.named_modules() if name}
    if hasattr(model, "wrap_units"):
        units = list(model.wrap_units())
        unknown = [type(u).__name__ for u in units if id(u) not in names]
        if unknown:
            raise ValueError(f"wrap_units() returned modules that are not submodules of the model: {unknown}")
        chosen = [names[id(u)] for u in units]
    else:
        chosen = [name for name, child in model.named_children() if any(True for _ in child.parameters())]
    # stable: units at one depth keep the model's (forward) order
    return tuple(sorted(dict.fromkeys(chosen), key=lambda name: -name.count(".")))


def sharding_policy(
    config: DistributedConfig, units: tuple[str, ...], world_size: int, local_world_size: int,
    checkpointed: tuple[str, ...] = (),
) -> ShardingPolicy:
    tp = config.tp
    # FSDP2 shards over the data-parallel ranks: the mesh without its tp dimension
    shape, dim_names = mesh_shape(config.fsdp_sharding, world_size // tp, max(local_world_size // tp, 1))
    return ShardingPolicy(
        units=units,
        reshard_after_forward=config.fsdp_sharding != "shard_grad_op",
        mesh_shape=shape,
        mesh_dim_names=dim_names,
        param_dtype=config.mixed_precision_policy,
        reduce_dtype="fp32",
        cpu_offload=config.cpu_offload,
        checkpointed=checkpointed,
        tensor_parallel=tp,
    )


def shard_options(policy: ShardingPolicy, mesh: DeviceMesh) -> dict[str, Any]:
    """fully_shard's keyword arguments for every unit and the root under `policy`, over `mesh` (data-parallel)."""
    return dict(mesh=mesh, mp_policy=_mp_policy(policy), offload_policy=_offload_policy(policy))


def _mp_policy(policy: ShardingPolicy) -> MixedPrecisionPolicy:
    if policy.param_dtype == "fp32":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=DTYPES[policy.param_dtype], reduce_dtype=DTYPES[policy.reduce_dtype])


def _offload_policy(policy: ShardingPolicy) -> OffloadPolicy:
    if not policy.cpu_offload:
        return OffloadPolicy()
    # Pinned host memory needs CUDA; a CPU-only run offloads to where it already is.
    return CPUOffloadPolicy(pin_memory=torch.cuda.is_available())


class FSDPWrapper(ProcessGroupUser):
    """Shards a model over the ranks with FSDP2."""

    def __init__(self, model: nn.Module, config: DistributedConfig, *, compile_backend: Optional[Backend] = None,
                 run_layout: Optional[RunLayout] = None, steps: Optional[StepSettings] = None):
        super().__init__(config, compile_backend=compile_backend, run_layout=run_layout, steps=steps)
        self.model = model
        self.wrapped: Optional[FSDPModule] = None
        self.mesh: Optional[DeviceMesh] = None

    def setup(self, rank: int, world_size: int, *, materialize: Optional[Materialize] = None) -> nn.Module:
        """Shard in place. A model built on the meta device is then materialised and initialised by
        `materialize`: each rank allocates and fills only its own shards (without it, it stays on meta)."""
        run = self.join_process_group(rank, world_size)
        device = run.device
        self.model = self.sync_batchnorm(self.model, device)
        policy = self.get_sharding_policy(world_size)
        self.mesh = run.mesh
        if policy.tensor_parallel > 1:
            apply_tensor_parallel(self.model, run.tp_mesh)
        self.prepare_blocks(self.model)
        modules = dict(self.model.named_modules())
        options = shard_options(policy, run.dp_mesh)
        for name in policy.units:
            fully_shard(modules[name], reshard_after_forward=policy.reshard_after_forward, **options)
        # None lets FSDP keep the root gathered after forward: backward needs it first anyway.
        self.wrapped = fully_shard(self.model, reshard_after_forward=None, **options)
        if materialize is not None:
            # With CPU offload the sharded states live in host memory.
            materialize(self.wrapped, torch.device("cpu") if policy.cpu_offload else device)
        return self.ready(self.wrapped)

    def get_sharding_policy(self, world_size: Optional[int] = None) -> ShardingPolicy:
        """The policy for `world_size` ranks (default: the process group's), as setup applies it."""
        if world_size is None:
            if not dist.is_initialized():
                raise RuntimeError("get_sharding_policy() needs world_size= or an initialised process group")
            world_size = dist.get_world_size()
        ranks_per_node = self.run_layout.ranks.local_world_size if self.run_layout else local_world_size(world_size)
        return sharding_policy(
            self.config, unit_names(self.model), world_size, ranks_per_node, self.checkpointed_blocks(self.model)
        )

    def save_distributed_checkpoint(self, path: str, *, optimizer: Optional[Optimizer] = None) -> None:
        """Every rank writes its shards (torch.distributed.checkpoint, committed atomically)."""
        checkpoints.save_model(path, self._require_setup(), optimizer=optimizer)

    def load_distributed_checkpoint(self, path: str, *, optimizer: Optional[Optimizer] = None) -> None:
        """Load into the sharded model, resharding when the checkpoint came from another world size."""
        checkpoints.load_model(path, self._require_setup(), optimizer=optimizer)

    def _require_setup(self) -> FSDPModule:
        if self.wrapped is None:
            raise RuntimeError("FSDPWrapper.setup() must run before checkpointing")
        return self.wrapped
