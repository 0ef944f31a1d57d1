"""This rank's model, ready to train: built on the meta device, wrapped as the layout says, initialised in place."""

from __future__ import annotations

from typing import Optional

from torch import nn

from ..config import TrainerConfig
from ..model.init_from import WeightSource, open_source
from ..model.materialize import Initializer, build, is_meta
from ..parallel.blocks import COMPILE_BACKEND
from ..parallel.ddp import ProcessGroupUser
from ..parallel.run_layout import RunLayout
from ..parallel.wrappers import make_wrapper
from .loss import step_settings


def build_and_wrap(cfg: TrainerConfig, run: RunLayout) -> tuple[ProcessGroupUser, nn.Module, Optional[WeightSource]]:
    """This rank's model, ready to train, without the whole model on any rank that shards it.

    Built on the meta device, checked against model.init_from's tensors,
    wrapped (blocks checkpointed and compiled, then sharded), materialised and
    initialised in place (each rank fills only its own shards), then loaded
    with init_from's weights. Returns (wrapper, model, the init_from source).
    """
    model = build(cfg.model, cfg.training.seed)
    source = open_source(cfg.model.init_from, model) if cfg.model.init_from else None
    compile_backend = COMPILE_BACKEND if cfg.training.compiles(run.device.type) else None
    wrapper = make_wrapper(model, run.distributed, step_settings(cfg, run), compile_backend=compile_backend,
                           run_layout=run)
    model = wrapper.setup(run.rank, run.world_size,
                          materialize=Initializer(cfg.training.seed) if is_meta(model) else None)
    if source is not None:
        source.load_into(model)
    return wrapper, model, source
