"""TrainState: everything a resume needs, as a torch.distributed.checkpoint Stateful."""

from __future__ import annotations

import pickle
import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful


MODEL_PREFIX = "model."  # the flattened checkpoint keys of the model's state dict (TrainState.state_dict)


def rng_key(rank: int) -> str:
    """The flattened checkpoint key of one rank's RNG states."""
    return f"rng.rank{rank}"


def _capture_rng() -> bytes:
    states = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return pickle.dumps(states)


def _restore_rng(blob: bytes) -> None:
    states = pickle.loads(blob)
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])


class TrainState(Stateful):
    """Model, optimizer, LR scheduler, grad scaler, progress and RNG of one rank.

    `model` may be plain, DDP-wrapped or FSDP2-sharded: `get_state_dict` yields
    each rank's own shards (DTensors under FSDP2), so saving never gathers a
    full state dict. `step` counts optimizer steps; `sample_index` is the
    global sample index (samples consumed by all ranks together), which does
    not depend on the world size. RNG states are per rank, stored under
    `rng.rank<N>`; a rank with no saved state (more ranks than at save time)
    keeps its own.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None, scaler: Any = None):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.step = 0
        self.sample_index = 0

    @property
    def rank(self) -> int:
        return dist.get_rank() if dist.is_initialized() else 0

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        sd: dict[str, Any] = {
            "model": model_sd,
            "optim": optim_sd,
            "progress": {"step": self.step, "sample_index": self.sample_index},
            "rng": {f"rank{self.rank}": _capture_rng()},
        }
        if self.scheduler is not None:
            sd["scheduler"] = self.scheduler.state_dict()
        if self.scaler is not None:
            sd["scaler"] = self.scaler.state_dict()
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"], optim_state_dict=state_dict["optim"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state_dict["scheduler"])
        if self.scaler is not None and state_dict.get("scaler"):
            self.scaler.load_state_dict(state_dict["scaler"])
        self.step = int(state_dict["progress"]["step"])
        self.sample_index = int(state_dict["progress"]["sample_index"])
        blob = state_dict.get("rng", {}).get(f"rank{self.rank}")
        if blob:
            _restore_rng(blob)
