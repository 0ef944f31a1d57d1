"""Learning-rate schedule: linear warmup, cosine decay to a floor, and linear batch scaling.

Pure functions of the step and the config; the loop wraps `WarmupCosine` in a
torch LambdaLR, whose state (the step) goes into checkpoints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config import TrainingConfig

if TYPE_CHECKING:  # torch stays out of this module's imports
    from torch.optim.lr_scheduler import LambdaLR


@dataclass
class WarmupCosine:
    """Multiplier of the peak LR at optimizer step `step` (0-based), as LambdaLR expects."""

    warmup_steps: int
    total_steps: int
    min_lr_ratio: float

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            # (step + 1): the first step already learns; the peak is reached at the last warmup step
            return (step + 1) / self.warmup_steps
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine

    @classmethod
    def from_config(cls, training: TrainingConfig) -> "WarmupCosine":
        return cls(training.warmup_steps, training.steps, training.min_lr_ratio)


def peak_learning_rate(training: TrainingConfig, effective_batch_size: int) -> float:
    """learning_rate, scaled by effective batch / reference batch under `lr_scaling: linear`."""
    if training.lr_scaling == "linear":
        return training.learning_rate * effective_batch_size / training.reference_batch_size
    return training.learning_rate


def follow_config(scheduler: "LambdaLR", schedule: WarmupCosine, peak_lr: float) -> None:
    """Make a resumed LambdaLR follow this run's schedule rather than the checkpoint's.

    A checkpoint restores the schedule object and the base LRs it was saved
    with; a resume with more `steps` (or another peak) must stretch the decay
    instead. For an unchanged config this changes nothing.
    """
    scheduler.lr_lambdas = [schedule for _ in scheduler.optimizer.param_groups]
    scheduler.base_lrs = [peak_lr for _ in scheduler.optimizer.param_groups]
    for group in scheduler.optimizer.param_groups:
        group["lr"] = peak_lr * schedule(scheduler.last_epoch)
