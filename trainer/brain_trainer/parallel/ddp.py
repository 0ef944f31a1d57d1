"""Data parallelism with DistributedDataParallel (every rank holds the whole model), and the single-process case.

The wrappers share one interface (the seed's contract): `setup(rank,
world_size)` returns the model to train, `all_reduce_metrics` averages over
ranks, `cleanup` leaves the process group as it found it.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..config import DistributedConfig
from .blocks import Backend, apply_block_options, block_names, checkpointed_blocks

log = logging.getLogger(__name__)

# Called by a wrapper's setup with the model (sharded already under FSDP) and the device to
# materialise a meta-built model on (materialize.Initializer).
Materialize = Callable[[nn.Module, torch.device], None]


def local_device() -> torch.device:
    """cuda:LOCAL_RANK when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def collective_device() -> torch.device:
    """Where a small tensor for a collective goes: the CPU under gloo (or without a process group), else this
    rank's accelerator."""
    if not dist.is_initialized() or dist.get_backend() == "gloo":
        return torch.device("cpu")
    return local_device()


def use_local_device() -> torch.device:
    """local_device(), made CUDA's current device so that kernels and NCCL run on this rank's GPU."""
    device = local_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def ensure_process_group(config: DistributedConfig, rank: int, world_size: int) -> bool:
    """Join the default process group (env:// rendezvous); reuse one that exists.

    Returns True when this call created the group, so the caller knows it owns it.
    """
    if dist.is_initialized():
        if (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
            raise ValueError(
                f"setup(rank={rank}, world_size={world_size}) disagrees with the existing process group "
                f"(rank {dist.get_rank()} of {dist.get_world_size()})"
            )
        return False
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: must be in [0, world_size={world_size}), got {rank}")
    backend = config.resolved_backend(torch.cuda.is_available())
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=config.timeout_seconds))
    return True


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


class ProcessGroupUser:
    """Joins the default process group in setup; cleanup destroys it only if this object created it.

    The config's unset fields are resolved (`DistributedConfig.resolved`):
    the wrappers always see concrete settings. `compile_backend` compiles
    every block with torch.compile (None: not compiled).
    """

    def __init__(self, config: DistributedConfig, *, compile_backend: Optional[Backend] = None):
        self.config = config.resolved()
        self.compile_backend = compile_backend
        self._owns_group = False

    def checkpointed_blocks(self, model: nn.Module) -> tuple[str, ...]:
        """The blocks whose activations are recomputed in backward (distributed.activation_checkpointing)."""
        return checkpointed_blocks(
            block_names(model), self.config.activation_checkpointing, self.config.activation_checkpointing_every
        )

    def prepare_blocks(self, model: nn.Module) -> None:
        """Activation checkpointing and torch.compile per block, before the model is wrapped."""
        apply_block_options(model, self.checkpointed_blocks(model), self.compile_backend)

    def join_process_group(self, rank: int, world_size: int) -> None:
        self._owns_group = ensure_process_group(self.config, rank, world_size) or self._owns_group

    def cleanup(self) -> None:
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False

    def all_reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """The mean of each metric over all ranks (every rank passes the same keys)."""
        return all_reduce_mean(metrics)

    def sync_batchnorm(self, model: nn.Module, device: torch.device) -> nn.Module:
        """BatchNorm layers made SyncBatchNorm when configured and possible."""
        if not (self.config.sync_batchnorm and has_batchnorm(model)):
            return model
        if device.type == "cpu":
            # SyncBatchNorm runs only on accelerators; on CPU each rank keeps its own statistics.
            log.warning("sync_batchnorm ignored on CPU: BatchNorm statistics stay per rank")
            return model
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)


def place(model: nn.Module, device: torch.device, materialize: Optional[Materialize]) -> nn.Module:
    """The whole model on `device`: materialised there when given a materializer (a meta-built model), else moved."""
    if materialize is None:
        return model.to(device)
    materialize(model, device)
    return model


class SingleDeviceWrapper(ProcessGroupUser):
    """strategy single: one process trains the model on its device, unwrapped."""

    def __init__(self, model: nn.Module, config: DistributedConfig, *, compile_backend: Optional[Backend] = None):
        super().__init__(config, compile_backend=compile_backend)
        self.model = model

    def setup(self, rank: int, world_size: int, *, materialize: Optional[Materialize] = None) -> nn.Module:
        self.join_process_group(rank, world_size)
        self.prepare_blocks(self.model)
        return place(self.model, use_local_device(), materialize)


class DDPWrapper(ProcessGroupUser):
    """Places the model on this rank's device and wraps it in DDP."""

    def __init__(self, model: nn.Module, config: DistributedConfig, *, compile_backend: Optional[Backend] = None):
        super().__init__(config, compile_backend=compile_backend)
        self.model = model
        self.wrapped: Optional[DistributedDataParallel] = None

    def setup(self, rank: int, world_size: int, *, materialize: Optional[Materialize] = None) -> nn.Module:
        """Wrap in DDP; a meta-built model is materialised and initialised first (`materialize`)."""
        self.join_process_group(rank, world_size)
        device = use_local_device()
        self.prepare_blocks(self.model)
        model = self.sync_batchnorm(place(self.model, device, materialize), device)
        self.wrapped = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=self.config.find_unused_parameters,
        )
        return self.wrapped


def all_reduce_mean(metrics: dict[str, float]) -> dict[str, float]:
    """The mean of each metric over all ranks, in one float64 all-reduce.

    Every rank must pass the same keys; they are sent in sorted order so the
    packing agrees across ranks whatever order each rank built its dict in.
    """
    values = {key: _number(key, value) for key, value in metrics.items()}
    if not dist.is_initialized() or not values:  # a single process is its own mean
        return values
    keys = sorted(values)
    world_size = dist.get_world_size()
    return {key: total / world_size for key, total in zip(keys, _summed([values[k] for k in keys]))}


def all_reduce_weighted_mean(total: float, weight: float) -> float:
    """The sum of `total` over all ranks divided by the sum of `weight`: a mean that ranks without values (weight
    0) join."""
    if not dist.is_initialized():
        return total / weight
    summed, weights = _summed([total, weight])
    return summed / weights


def _summed(values: list[float]) -> list[float]:
    """Each value summed over all ranks, in one float64 all-reduce."""
    packed = torch.tensor(values, dtype=torch.float64, device=collective_device())
    dist.all_reduce(packed, op=dist.ReduceOp.SUM)
    return packed.tolist()


def _number(key: str, value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"metrics[{key!r}]: must be a number, got {value!r}") from None
