"""The optimizer: AdamW over two parameter groups (decayed, not), with the kernels the layout allows."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..checkpoint import WholeModel
from ..config import TrainingConfig
from ..plan.layout import Layout
from ..parallel.pipeline import PipelineWrapper

ADAMW_BETAS = (0.9, 0.95)


def decays(ndim: int) -> bool:
    """Weight decay on matrices and embeddings (>= 2-D) only, never on biases and norm gains."""
    return ndim >= 2


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """The optimizer's two groups: decayed, then not (`decays`).

    Two groups at every layout: a checkpoint's optimizer and schedule state (one entry per group) loads under any other."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if decays(p.ndim)], "weight_decay": weight_decay},
        {"params": [p for p in params if not decays(p.ndim)], "weight_decay": 0.0},
    ]


def whole_model(wrapper: PipelineWrapper) -> WholeModel:
    """What a pipeline rank's checkpoint part belongs to: the whole model's tensors and optimizer groups."""
    shapes, parameters = wrapper.whole, wrapper.whole_parameters
    return WholeModel(shapes=shapes, optimizer_groups=(
        tuple(name for name in parameters if decays(len(shapes[name]))),
        tuple(name for name in parameters if not decays(len(shapes[name]))),
    ))


def optimizer_kernels(device: torch.device, layout: Layout) -> dict[str, bool | None]:
    """AdamW's implementation: fused (one kernel for all parameters) on GPU, unless tensor parallelism puts the
    parameters on two device meshes ((dp..., tp) for the split ones, (dp...) for the rest), which one fused or
    foreach call over DTensors cannot mix: then the per-parameter loop (CPU uses it anyway)."""
    if layout.tp > 1:
        return {"fused": False, "foreach": False}
    return {"fused": True if device.type == "cuda" else None}


def adamw(model: nn.Module, training: TrainingConfig, lr: float, device: torch.device,
          layout: Layout) -> torch.optim.AdamW:
    """The training's optimizer over `model`'s parameters (this rank's part of them)."""
    return torch.optim.AdamW(param_groups(model, training.weight_decay), lr=lr, betas=ADAMW_BETAS,
                             **optimizer_kernels(device, layout))
