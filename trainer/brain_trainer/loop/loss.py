"""What a training step computes: the loss, in the forward's precision, and the step settings a wrapper runs under."""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F

from ..config import TrainerConfig
from ..parallel.run_layout import RunLayout
from ..parallel.step import StepSettings

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, computed in fp32 whatever the autocast dtype."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def autocast_context(policy: str, device: torch.device) -> contextlib.AbstractContextManager:
    dtype = AUTOCAST_DTYPES.get(policy)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def step_settings(cfg: TrainerConfig, run: RunLayout) -> StepSettings:
    """The training's step at this layout: the accumulation steps are a pipeline's micro-batches."""
    return StepSettings(seq_len=cfg.training.seq_len, micro_batches=run.micro_batches(cfg), loss_fn=loss_fn,
                        autocast=functools.partial(autocast_context, run.distributed.mixed_precision_policy, run.device))
