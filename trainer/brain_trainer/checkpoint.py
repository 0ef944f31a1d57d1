"""Sharded, atomically committed, asynchronous, resumable checkpoints (DESIGN.md §5).

Public API (the training loop codes against it):

    state = TrainState(model, optimizer, scheduler, scaler)
    ckpt = CheckpointManager(cfg.checkpoint, rank=rank, world_size=world, config_hash=cfg.config_hash())
    ckpt.restore(state)                  # newest committed checkpoint, if any
    for ...:
        state.step += 1; state.sample_index += global_batch
        ckpt.after_step(state)           # interval saves; SIGTERM -> save, commit, exit PREEMPTED
    ckpt.finish(state)

Work in progress: bodies land in the next edit.
"""

from __future__ import annotations

from typing import Any

import torch

from .config import CheckpointConfig


class TrainState:
    """Everything a resume needs; a torch.distributed.checkpoint Stateful."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None, scaler: Any = None):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.step = 0
        self.sample_index = 0

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise NotImplementedError


class CheckpointManager:
    def __init__(self, cfg: CheckpointConfig, *, rank: int, world_size: int, config_hash: str):
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.config_hash = config_hash

    def restore(self, state: TrainState) -> int | None:
        return None

    def after_step(self, state: TrainState) -> None:
        return None

    def finish(self, state: TrainState) -> None:
        return None


def save_model(path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    raise NotImplementedError


def load_model(path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    raise NotImplementedError
