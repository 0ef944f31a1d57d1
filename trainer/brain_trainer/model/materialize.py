"""Building the model on the meta device and initialising it in place, after it is wrapped (docs/model.md, "Initialisation").

    model = build(model_cfg, seed)        # on meta when it can be initialised in place
    ... wrap it (fully_shard per block and root, or nothing yet for DDP) ...
    Initializer(seed)(module, device)     # to_empty, then each rank fills only its own shards

No rank ever holds the whole model unless its strategy keeps a whole replica
(DDP, single, FSDP no_shard). BrainAI initialises itself with `init_weights()`;
any model whose root has `init_weights()` is initialised the same way, and
any other through each module's `reset_parameters()`, except that a BrainAI
block a user model reuses initialises all of itself as it does inside BrainAI
(`brain_ai.reset_block`, the residual projections scaled to the user model's
depth). A user model
(`model.entrypoint`) some of whose modules hold tensors but define no
`reset_parameters()` is built whole on every rank instead (the old path),
with a warning that says what to add.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from ..config import ModelConfig
from ..parallel.ddp import collective_device
from ..schema import ConfigError, FieldError
from .brain_ai import Block, build_model, reset_block, residual_out_std
from .seeded_init import poison, seeded_fills, unset

log = logging.getLogger(__name__)


def _owns_tensors(module: nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False))


def not_initialisable(model: nn.Module) -> Optional[str]:
    """Why `model` cannot be initialised in place after to_empty (None when it can)."""
    if callable(getattr(model, "init_weights", None)):
        return None
    inside_blocks = {id(m) for block in model.modules() if isinstance(block, Block) for m in block.modules()}
    for name, module in model.named_modules():
        if id(module) in inside_blocks:
            continue  # a BrainAI block initialises all of itself
        if _owns_tensors(module) and not callable(getattr(module, "reset_parameters", None)):
            where = f" (at {name})" if name else " (the root)"
            return (
                f"{type(module).__name__}{where} holds parameters or buffers but defines no reset_parameters(); "
                "add one that fills them in place (nn.init functions on self's tensors), "
                "or give the root module an init_weights() that initialises everything"
            )
    return None


def build(model_cfg: ModelConfig, seed: int) -> nn.Module:
    """The model to wrap: on the meta device when it can be initialised in place, else built whole on the CPU."""
    problem = None
    try:
        with torch.device("meta"):
            model = build_model(model_cfg)
    except ConfigError:
        raise
    except Exception as exc:  # a user model that does real work while it is built
        problem = f"building it on the meta device raised {type(exc).__name__}: {exc}"
    else:
        problem = not_initialisable(model)
        if problem is None:
            return model
    log.warning("model.entrypoint %s: %s; building the whole model on every rank instead", model_cfg.entrypoint, problem)
    torch.manual_seed(seed)  # identical initial weights on every rank
    return build_model(model_cfg)


def is_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in model.parameters())


def _initialise(model: nn.Module) -> None:
    init_weights = getattr(model, "init_weights", None)
    if callable(init_weights):
        init_weights()
        return
    _reset(model, residual_out_std(model))


def _reset(module: nn.Module, out_std: float) -> None:
    """Each module that holds tensors resets them, parents before children; a BrainAI block resets all of itself."""
    if isinstance(module, Block):
        reset_block(module, out_std)
        return
    if _owns_tensors(module):
        module.reset_parameters()
    for child in module.children():
        _reset(child, out_std)


class Initializer:
    """Materialises a meta-built (possibly sharded) model on a device and initialises it in place.

    The wrappers call it once their sharding is in place (FSDP) or before they
    wrap (DDP, single); see `seeded_init` for why the result does not depend
    on the world size or the strategy.
    """

    def __init__(self, seed: int):
        self.seed = seed

    def __call__(self, model: nn.Module, device: torch.device) -> None:
        model.to_empty(device=device)
        poison(model)
        with seeded_fills(model, self.seed):
            _initialise(model)
        missing = unset(model)
        flag = torch.tensor([float(bool(missing))], device=collective_device())
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            what = f"{missing[0]} is" if missing else "a parameter or buffer on another rank is"
            raise ConfigError(
                [FieldError("model", f"{what} not set by the model's initialisation (still NaN after "
                                     "init_weights()/reset_parameters()): initialise every parameter and buffer there")]
            )
