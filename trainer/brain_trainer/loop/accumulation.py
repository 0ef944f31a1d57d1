"""Gradient accumulation: k micro-steps, one optimizer step, one gradient sync.

Driven like this (forward *inside* the context, since DDP decides at forward
time whether the coming backward syncs):

    with acc.sync_context(micro_idx):
        loss = loss_fn(model(x), y)
        stepped = acc.step(loss, optimizer, micro_idx)

The training loop splits `step` in two: the wrapper's `train_step` runs the
window's micro-steps (`sync_context`, `backward`), the loop then `apply`s.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterable, Iterator, Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.amp import GradScaler
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer


class GradientAccumulator:
    """Scales each micro-step's loss by 1/k and steps the optimizer every k micro-steps."""

    def __init__(
        self,
        accumulation_steps: int,
        scaler: Optional[GradScaler] = None,
        *,
        model: Optional[nn.Module] = None,
        max_grad_norm: float = 0.0,
        pipeline_group: Optional[dist.ProcessGroup] = None,
    ):
        """`pipeline_group`: under pipeline parallelism, the ranks holding the other stages of this rank's
        parameters' model: the gradient norm is taken over all of them."""
        if not isinstance(accumulation_steps, int) or accumulation_steps < 1:
            raise ValueError(f"accumulation_steps: must be an integer >= 1, got {accumulation_steps!r}")
        if not max_grad_norm >= 0:  # also rejects NaN
            raise ValueError(f"max_grad_norm: must be >= 0, got {max_grad_norm!r}")
        self.accumulation_steps = accumulation_steps
        self.scaler = scaler
        self.model = model
        # Listed once: walking the module tree for them after every step costs more than the rest of the step's
        # bookkeeping together. The optimizer holds the same tensors, so they stay the model's for the whole run.
        self._model_parameters = list(model.parameters()) if model is not None else None
        self.max_grad_norm = max_grad_norm
        self.pipeline_group = pipeline_group
        # Total gradient norm before clipping at the last optimizer step, kept on the device: read at logging steps
        # only, so an accelerator is not made to wait for it after every step.
        self._grad_norm: Union[Tensor, float] = math.nan

    @property
    def last_grad_norm(self) -> float:
        """Total gradient norm before clipping at the last optimizer step (NaN before the first)."""
        return float(self._grad_norm)

    def is_boundary(self, micro_idx: int) -> bool:
        """True on the micro-step that completes an accumulation window."""
        if micro_idx < 0:
            raise ValueError(f"micro_idx: must be >= 0, got {micro_idx}")
        return (micro_idx + 1) % self.accumulation_steps == 0

    @contextlib.contextmanager
    def sync_context(self, micro_idx: int) -> Iterator[None]:
        """Suppress the gradient all-reduce/reduce-scatter on non-boundary micro-steps."""
        sync = self.is_boundary(micro_idx)
        model = self.model
        if isinstance(model, DistributedDataParallel) and not sync:
            with model.no_sync():
                yield
        elif isinstance(model, FSDPModule):
            # FSDP2 has no context manager; the flag stays until the next call sets it.
            model.set_requires_gradient_sync(sync)
            yield
        else:
            yield

    def step(self, loss: Tensor, optimizer: Optimizer, step_idx: int) -> bool:
        """Backward this micro-step; on a boundary, clip and step. Returns True when it stepped."""
        boundary = self.is_boundary(step_idx)
        self.backward(loss)
        if not boundary:
            return False
        self.apply(optimizer)
        return True

    def backward(self, loss: Tensor) -> None:
        """Backward of one micro-step's loss, scaled by 1/k (and by the fp16 loss scale): the gradients add up to the
        mean over the window."""
        scaled = loss / self.accumulation_steps
        if self.scaler is not None:
            scaled = self.scaler.scale(scaled)
        scaled.backward()

    def apply(self, optimizer: Optimizer) -> None:
        """Clip the gradients in place and step the optimizer, then clear them (the end of `step` on a boundary;
        under pipeline parallelism the schedule has run the step's backward passes itself)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        self._grad_norm = self._clip(self._parameters(optimizer))
        if self.scaler is not None:
            self.scaler.step(optimizer)  # skips the update when gradients overflowed
            self.scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def effective_batch_size(self, micro_batch: int, world_size: int) -> int:
        """Samples per optimizer step over all ranks: micro_batch x k x world_size."""
        for name, value in (("micro_batch", micro_batch), ("world_size", world_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        return micro_batch * self.accumulation_steps * world_size

    def _parameters(self, optimizer: Optimizer) -> list[Tensor]:
        source: Iterable[Tensor] = (
            self._model_parameters
            if self._model_parameters is not None
            else (p for group in optimizer.param_groups for p in group["params"])
        )
        return [p for p in source if p.grad is not None]

    def _clip(self, params: list[Tensor]) -> Union[Tensor, float]:
        """Clip to max_grad_norm (0 = never) and return the norm before clipping."""
        groups = by_mesh(params)
        norm = total_norm(groups) if params else torch.zeros(())
        if self.pipeline_group is not None:
            # the squared norms of the stages' parameters add up (every rank of the pipeline joins, with or without
            # gradients)
            squared = (norm.float() ** 2).reshape(1)
            dist.all_reduce(squared, group=self.pipeline_group)
            norm = squared.sqrt()[0]
        elif not params:
            return 0.0
        if self.max_grad_norm > 0:
            for group in groups:
                torch.nn.utils.clip_grads_with_norm_(group, self.max_grad_norm, norm, foreach=_foreach(group))
        return norm


def by_mesh(params: list[Tensor]) -> list[list[Tensor]]:
    """`params` grouped by their gradients' device mesh (plain tensors: one group).

    Under tensor parallelism FSDP2 leaves two meshes (the split blocks' dp x tp,
    everything else's dp), and one DTensor op cannot mix them."""
    groups: dict[Any, list[Tensor]] = {}
    for p in params:
        groups.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p)
    return list(groups.values())


def total_norm(groups: list[list[Tensor]]) -> Tensor:
    """The 2-norm of all the groups' gradients, one plain tensor: a DTensor's norm is partial over its shards,
    reduced once per mesh."""
    norms = []
    for group in groups:
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], foreach=_foreach(group))
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    return norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))


def _foreach(params: list[Tensor]) -> Optional[bool]:
    """The fused kernels need every gradient on one device type; let torch pick otherwise."""
    return None if len({p.grad.device.type for p in params}) == 1 else False
