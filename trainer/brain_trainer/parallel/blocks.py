"""Per-block options applied before a model is wrapped: activation checkpointing and torch.compile.

A model's blocks are its leaf wrap units in forward order: the units of
`wrap_units()` that contain no other unit (BrainAI: encoders, every block of
every stack, meta, heads), else its top-level children that hold parameters.
Both options act on one block at a time, whatever the strategy, and keep
parameter names unchanged (checkpoints, initFrom and export see the same names).

    none        nothing is recomputed
    full        every block keeps only its input and is recomputed in backward
    selective   every k-th block is (k = distributed.activation_checkpointing_every)

torch.compile is lazy: each block compiles at its first call. When one fails
(no C++ compiler or Triton, a lowering error), every block goes back to its
eager forward, with one warning line, and training goes on.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Union

import torch
from torch import nn
from torch.distributed._composable import checkpoint as activation_checkpoint

log = logging.getLogger(__name__)

COMPILE_BACKEND = "inductor"  # torch.compile's own default: fused Triton kernels on CUDA, C++ on CPU
Backend = Union[str, Callable[..., Any]]  # a torch.compile backend: its name, or the callable itself


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


def apply_block_options(model: nn.Module, checkpointed: tuple[str, ...], compile_backend: Optional[Backend]) -> None:
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
        compile_blocks([(name, modules[name]) for name in block_names(model)], compile_backend)


def compile_blocks(blocks: list[tuple[str, nn.Module]], backend: Backend) -> None:
    """Compile each block's forward; at the first compile that fails, all of them train eager from then on."""
    from torch._dynamo.exc import TorchDynamoException  # a backend's failure arrives as BackendCompilerFailed

    eager = [(block, block.forward) for _, block in blocks]

    def fall_back(name: str, exc: BaseException) -> None:
        cause = getattr(exc, "inner_exception", None) or exc  # what the backend raised, when it was the backend
        first = (str(cause).strip().splitlines() or [""])[0]
        log.warning("torch.compile failed in %s (%s: %s): every block trains eager", name, type(cause).__name__, first)
        for block, forward in eager:
            block.forward = forward

    def guarded(name: str, forward: Callable[..., Any]) -> Callable[..., Any]:
        # The block's own forward: each block class gets its own compile cache (a whole module's
        # compile shares one cache, nn.Module's _call_impl, among every class), hooks stay outside.
        compiled = torch.compile(forward, backend=backend)

        def forward_or_eager(*args: Any, **kwargs: Any) -> Any:
            try:
                return compiled(*args, **kwargs)
            except TorchDynamoException as exc:
                fall_back(name, exc)
                return forward(*args, **kwargs)

        return forward_or_eager

    for (name, block), (_, forward) in zip(blocks, eager):
        block.forward = guarded(name, forward)
