"""The wrapper for a resolved strategy: the one table the loop picks from."""

from __future__ import annotations

from typing import Optional

from torch import nn

from ..config import DistributedConfig
from .blocks import Backend
from .ddp import DDPWrapper, ProcessGroupUser, SingleDeviceWrapper
from .fsdp import FSDPWrapper
from .pipeline import PipelineWrapper
from .run_layout import RunLayout
from .step import StepSettings

WRAPPERS = {"single": SingleDeviceWrapper, "ddp": DDPWrapper, "fsdp": FSDPWrapper}


def make_wrapper(model: nn.Module, dist_cfg: DistributedConfig, steps: StepSettings, *,
                 compile_backend: Optional[Backend] = None, run_layout: Optional[RunLayout] = None) -> ProcessGroupUser:
    """The seed's wrapper for a resolved strategy (SingleDeviceWrapper, DDPWrapper or FSDPWrapper), PipelineWrapper
    (FSDP2 per stage) under pipeline parallelism; each runs the training's steps as `steps` says."""
    options = dict(compile_backend=compile_backend, run_layout=run_layout, steps=steps)
    if dist_cfg.pp > 1:
        return PipelineWrapper(model, dist_cfg, **options)
    return WRAPPERS[dist_cfg.strategy](model, dist_cfg, **options)
