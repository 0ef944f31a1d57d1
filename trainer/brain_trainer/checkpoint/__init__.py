"""Sharded, atomically committed, asynchronous, resumable checkpoints (DESIGN.md §5, docs/checkpoints.md).

    state = TrainState(model, optimizer, scheduler, scaler)
    ckpt = CheckpointManager(cfg.checkpoint, rank=rank, world_size=world, config_hash=cfg.config_hash())
    ckpt.restore(state)                  # newest committed, intact checkpoint, if any
    for ...:
        state.step += 1; state.sample_index += global_batch
        ckpt.after_step(state)           # interval saves; SIGTERM -> save, commit, exit PREEMPTED
    ckpt.finish(state)

Modules: store (folder layout, manifest, commit, retention; torch-free),
shards (DCP reads and writes), state (TrainState), manager (policy),
sample_log (opt-in per-step record of consumed samples, for resume checks).
"""

from .manager import CheckpointError, CheckpointManager, Preempted, load_model, save_model
from .sample_log import SampleLog
from .state import TrainState
from .store import ManifestError, latest_checkpoint

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "ManifestError",
    "Preempted",
    "SampleLog",
    "TrainState",
    "latest_checkpoint",
    "load_model",
    "save_model",
]
