"""What a wrapper's training step needs from the training settings, and from the loop's gradient accumulation.

Every wrapper runs one optimizer step's forward and backward passes itself
(`ProcessGroupUser.train_step`): one micro-batch at a time in DDP, FSDP2 and
alone, all of them in one schedule step under pipeline parallelism. The loop
then steps the optimizer, whatever the layout.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Protocol

from torch import Tensor

Loss = Callable[[Tensor, Tensor], Tensor]  # (logits, targets) -> the mean loss of one micro-batch
Batch = tuple[Tensor, Tensor]  # (tokens, targets) of one micro-batch


@dataclass(frozen=True)
class StepSettings:
    """The training settings a step runs under."""

    seq_len: int  # a pipeline's stages are balanced for it (attention's cost grows with it)
    micro_batches: int  # per optimizer step: the gradient accumulation steps (a pipeline schedules them)
    loss_fn: Loss  # the mean loss of one micro-batch (a pipeline schedule averages over micro-batches)
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext  # the forward's precision


class Accumulates(Protocol):
    """The part of `loop.GradientAccumulator` a step uses (the loop's room sits above this one)."""

    accumulation_steps: int

    def sync_context(self, micro_idx: int) -> ContextManager[None]: ...

    def backward(self, loss: Tensor) -> None: ...
