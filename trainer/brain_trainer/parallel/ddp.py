"""Data parallelism with DistributedDataParallel (every rank holds the whole model), and the single-process case.

The wrappers share one interface (the seed's contract): `setup(rank,
world_size)` returns the model to train, `all_reduce_metrics` averages over
ranks, `cleanup` leaves the process group as it found it. The loop drives
every wrapper alike: `train_step` (one optimizer step's forward and backward
passes), `logits` (evaluation's forward), `all_reduce_loss` (the logged
loss). A wrapper takes the run's layout (`run_layout.RunLayout`) when the loop
built one, else builds its own in setup.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Callable, Iterator, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from ..config import DistributedConfig
from .blocks import Backend, apply_block_options, block_names, checkpointed_blocks
from .run_layout import RunLayout
from .step import Accumulates, Batch, StepSettings

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
    """Join the default process group (env:// rendezvous; a group of one needs none); reuse one that exists.

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
    timeout = timedelta(seconds=config.timeout_seconds)
    if world_size == 1:
        # Nobody joins a group of one: an in-memory store, no port. Through env:// it would depend on what a
        # long-lived process holds from earlier runs (exported launch variables, torch's per-port TCPStore
        # servers); the test suite's in-process runs hung there.
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size, timeout=timeout)
    return True


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


class ProcessGroupUser:
    """Joins the default process group in setup; cleanup destroys it only if this object created it.

    The config's unset fields are resolved (`DistributedConfig.resolved`):
    the wrappers always see concrete settings. `compile_backend` compiles
    every block with torch.compile (None: not compiled). `run_layout`: the
    run's layout, built once by the loop (None: setup builds it from the
    environment). `steps`: what `train_step` runs under.
    """

    def __init__(self, config: DistributedConfig, *, compile_backend: Optional[Backend] = None,
                 run_layout: Optional[RunLayout] = None, steps: Optional[StepSettings] = None):
        self.config = config.resolved()
        self.compile_backend = compile_backend
        self.run_layout = run_layout
        self.steps = steps
        self.trained: Optional[nn.Module] = None  # what setup returned: the module a step runs
        self._owns_group = False

    def checkpointed_blocks(self, model: nn.Module) -> tuple[str, ...]:
        """The blocks whose activations are recomputed in backward (distributed.activation_checkpointing)."""
        return checkpointed_blocks(
            block_names(model), self.config.activation_checkpointing, self.config.activation_checkpointing_every
        )

    def prepare_blocks(self, model: nn.Module) -> None:
        """Activation checkpointing and torch.compile per block, before the model is wrapped."""
        apply_block_options(model, self.checkpointed_blocks(model), self.compile_backend)

    def join_process_group(self, rank: int, world_size: int) -> RunLayout:
        """Join the default process group; returns the run's layout: the one given, else this process's."""
        self._owns_group = ensure_process_group(self.config, rank, world_size) or self._owns_group
        if self.run_layout is None:
            self.run_layout = RunLayout.from_environment(self.config, rank, world_size, use_local_device())
        elif (self.run_layout.rank, self.run_layout.world_size) != (rank, world_size):
            raise ValueError(f"setup(rank={rank}, world_size={world_size}) disagrees with the run's layout "
                             f"(rank {self.run_layout.rank} of {self.run_layout.world_size})")
        return self.run_layout

    def ready(self, module: nn.Module) -> nn.Module:
        """The end of setup: `module` is what the steps run."""
        self.trained = module
        return module

    @property
    def pipeline_group(self) -> Optional[dist.ProcessGroup]:
        """The ranks holding the other stages of this rank's model (None: every rank holds every stage)."""
        return None

    @property
    def holds_last(self) -> bool:
        """Whether this rank computes the model's logits (under a pipeline, only the last stage's ranks)."""
        return True

    @property
    def micro_batches_per_pass(self) -> int:
        """Micro-batches one forward pass takes (a pipeline's schedule runs a step's at once)."""
        return 1

    def train_step(self, batches: Iterator[Batch], accumulator: Accumulates, losses: Tensor) -> int:
        """Forward and backward of one optimizer step's micro-batches from `batches`, one at a time, the gradients
        synchronised on the last (`accumulator.sync_context`) and left in the parameters for the optimizer. Adds
        each micro-batch's loss to `losses` (a running sum on the device); returns how many it added."""
        steps, module, device = self._require_steps(), self._require_trained(), self.run_layout.device
        for micro_idx in range(accumulator.accumulation_steps):
            x, y = next(batches)
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            with accumulator.sync_context(micro_idx):
                with steps.autocast():
                    loss = steps.loss_fn(module(x), y)
                accumulator.backward(loss)
            losses += loss.detach()
        return accumulator.accumulation_steps

    def logits(self, x: Tensor, y: Tensor) -> Optional[Tensor]:
        """Evaluation's forward pass of tokens `x` (targets `y`): the logits, or None where this rank has none."""
        return self._require_trained()(x)

    def all_reduce_loss(self, total: float, count: int) -> float:
        """The logged loss: the mean of each rank's mean over its `count` micro-batches (every rank has as many)."""
        return self.all_reduce_metrics({"loss": total / count})["loss"]

    def _require_steps(self) -> StepSettings:
        if self.steps is None:
            raise RuntimeError(f"{type(self).__name__}.train_step needs the step settings (steps=StepSettings(...))")
        return self.steps

    def _require_trained(self) -> nn.Module:
        if self.trained is None:
            raise RuntimeError(f"{type(self).__name__}.setup() must run first")
        return self.trained

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

    def __init__(self, model: nn.Module, config: DistributedConfig, *, compile_backend: Optional[Backend] = None,
                 run_layout: Optional[RunLayout] = None, steps: Optional[StepSettings] = None):
        super().__init__(config, compile_backend=compile_backend, run_layout=run_layout, steps=steps)
        self.model = model

    def setup(self, rank: int, world_size: int, *, materialize: Optional[Materialize] = None) -> nn.Module:
        run = self.join_process_group(rank, world_size)
        self.prepare_blocks(self.model)
        return self.ready(place(self.model, run.device, materialize))


class DDPWrapper(ProcessGroupUser):
    """Places the model on this rank's device and wraps it in DDP."""

    def __init__(self, model: nn.Module, config: DistributedConfig, *, compile_backend: Optional[Backend] = None,
                 run_layout: Optional[RunLayout] = None, steps: Optional[StepSettings] = None):
        super().__init__(config, compile_backend=compile_backend, run_layout=run_layout, steps=steps)
        self.model = model
        self.wrapped: Optional[DistributedDataParallel] = None

    def setup(self, rank: int, world_size: int, *, materialize: Optional[Materialize] = None) -> nn.Module:
        """Wrap in DDP; a meta-built model is materialised and initialised first (`materialize`)."""
        device = self.join_process_group(rank, world_size).device
        self.prepare_blocks(self.model)
        model = self.sync_batchnorm(place(self.model, device, materialize), device)
        self.wrapped = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=self.config.find_unused_parameters,
        )
        return self.ready(self.wrapped)


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
