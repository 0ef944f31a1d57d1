"""Training FLOPs per token of the model a job trains, counted by FlopCounterMode (docs/performance.md).

    flops = counted_flops_per_token(model_cfg, seq_len, loss_fn)   # once per process and shape: cached

One forward and backward pass of one sequence of `seq_len` tokens, on a
fresh build of the model on the meta device: no memory, no compute, and
the same count on every device, since on meta scaled_dot_product_attention
takes its math path (two matrix multiplies forward, four backward) where a
fused GPU kernel would also count the scores it recomputes. Per token at
the real sequence length, since attention grows with it.
config/model_flops.py is the same figure as a formula, for the torch-free
estimate; a test holds the two equal.
"""

from __future__ import annotations

import functools
import logging
from math import prod
from typing import Callable, Optional

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..config import ModelConfig
from .brain_ai import build_model

log = logging.getLogger(__name__)

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _convolution_backward(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                          _output_padding, _groups, output_mask, out_shape=None, **kwargs) -> int:
    """Each gradient a convolution computes costs what its forward does: 2 x output positions x weights.

    Replaces FlopCounterMode's formula, which ignores groups in the weight
    gradient and so counts a depthwise convolution's d_model times over.
    """
    positions = prod((x_shape if transposed else grad_out_shape)[2:])
    forward = 2 * grad_out_shape[0] * positions * prod(w_shape)
    return forward * (int(output_mask[0]) + int(output_mask[1]))


COUNTS = {torch.ops.aten.convolution_backward: _convolution_backward}


def count_training_flops(model: torch.nn.Module, tokens: torch.Tensor, loss: Loss) -> int:
    """FLOPs of one forward and backward pass of `model` on `tokens` (next-token targets: the tokens themselves)."""
    counter = FlopCounterMode(display=False, custom_mapping=COUNTS)
    with counter:
        loss(model(tokens), tokens).backward()
    return counter.get_total_flops()


@functools.lru_cache(maxsize=None)
def _counted(preset: str, vocab_size: Optional[int], entrypoint: Optional[str], seq_len: int,
             loss: Loss) -> Optional[int]:
    model_cfg = ModelConfig(preset=preset, vocab_size=vocab_size, entrypoint=entrypoint)
    try:
        with torch.device("meta"):
            model = build_model(model_cfg)
            tokens = torch.zeros((1, seq_len), dtype=torch.long)
        return count_training_flops(model, tokens, loss) // seq_len
    except Exception as exc:
        if entrypoint is None:
            raise  # BrainAI always runs on meta: a failure here is a bug to see
        # A user model that cannot run on meta tensors (it reads values on the host, say): the caller uses 6N.
        log.warning("model.entrypoint %s: cannot count its FLOPs on the meta device (%s: %s); MFU uses 6 x parameters",
                    entrypoint, type(exc).__name__, exc)
        return None


def counted_flops_per_token(model_cfg: ModelConfig, seq_len: int, loss: Loss) -> Optional[int]:
    """Training FLOPs per token of `model_cfg`'s model at `seq_len`; None for a user model that cannot be counted."""
    return _counted(model_cfg.preset, model_cfg.vocab_size, model_cfg.entrypoint, seq_len, loss)
