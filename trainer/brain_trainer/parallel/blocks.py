"""Per-block options applied before a model is wrapped: activation checkpointing and torch.compile.

A model's blocks are its leaf wrap units in forward order: the units of
`wrap_units()` that contain no other unit (BrainAI: encoders, every block of
every stack, meta, heads), else its top-level children that hold parameters.
Both options act on one block at a time, whatever the strategy, and keep
parameter names unchanged (checkpoints, initFrom and export see the same names).

    none        nothing is recomputed
    full        every block keeps only its input and is recomputed in backward
    selective   every k-th block is (k = distributed.activation_checkpointing_every)
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.distributed._composable import checkpoint as activation_checkpoint


def block_names(model: nn.Module) -> tuple[str, ...]:
    """Qualified names of the model's blocks, in forward order."""
    names = {id(module): name for name, module in model.named_modules() if name}
    if hasattr(model, "wrap_units"):
        units = [names[id(u)] for u in model.wrap_units() if id(u) in names]
    else:
        units = [name for name, child in model.named_children() if any(True for _ in child.parameters())]
    return tuple(u for u in units if not any(other.startswith(u + ".") for other in units))


def checkpointed_blocks(blocks: tuple[str, ...], mode: str, every: int) -> tuple[str, ...]:
    """The blocks whose activations are recomputed: all (full), every `every`-th (selective), none."""
    if mode == "full":
        return blocks
    if mode == "selective":
        return blocks[every - 1 :: every]
    return ()


def apply_block_options(model: nn.Module, checkpointed: tuple[str, ...], compile_backend: Optional[str]) -> None:
    """Checkpoint the named blocks, then compile every block with `compile_backend` (None: no compile), in place.

    Compiling per block keeps the graphs small and identical from block to
    block (one compilation serves every block of a kind) and leaves the
    model's own Python, FSDP's and checkpointing's hooks and the loss outside
    the compiled code.
    """
    modules = dict(model.named_modules())
    for name in checkpointed:
        activation_checkpoint(modules[name])
    if compile_backend is not None:
        for name in block_names(model):
            # The block's own forward: each block class gets its own compile cache (a whole module's
            # compile shares one cache, nn.Module's _call_impl, among every class), hooks stay outside.
            block = modules[name]
            block.forward = torch.compile(block.forward, backend=compile_backend)
