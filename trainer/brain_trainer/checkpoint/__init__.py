"""Sharded, atomically committed, asynchronous, resumable checkpoints (docs/checkpoints.md).

    state = TrainState(model, optimizer, scheduler, scaler)
    ckpt = CheckpointManager(cfg.checkpoint, rank=rank, world_size=world, config_hash=cfg.config_hash())
    ckpt.restore(state)                  # newest committed, intact checkpoint, if any
    cadence = Cadence(cfg.checkpoint, last_save=state.step)
    for ...:
        state.step += 1; state.sample_index += global_batch
        ckpt.after_step(state, save=cadence.due(state.step))   # loop/boundary.py adds the vote's requests
    ckpt.finish(state)                   # the final save, committed

Modules: store (folder layout, manifest, commit, retention; torch-free, as is
importing this package),
shards (DCP reads and writes), staging (asynchronous saves' copies to CPU memory, into
buffers allocated ahead of the first save), state (TrainState), manager (saves and restores), compat (does a
checkpoint fit this model; which settings changed),
cadence (when a save is due: a fixed interval or Young/Daly's; torch-free), resume_from (where a run
starts: latest, none or a step; torch-free), sample_log (opt-in per-step
record of consumed samples, for resume checks), lease (one job per checkpoint
folder, and the fencing generation of each worker group).
"""

from ..lazy import lazy_exports
from .store import ManifestError, latest_checkpoint

# These import torch; `store` (and so `latest_checkpoint`) does not.
_LAZY = {
    "CheckpointError": "compat",
    "CheckpointManager": "manager",
    "load_model": "manager",
    "save_model": "manager",
    "SampleLog": "sample_log",
    "TrainState": "state",
    "WholeModel": "state",
}

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "ManifestError",
    "SampleLog",
    "TrainState",
    "WholeModel",
    "latest_checkpoint",
    "load_model",
    "save_model",
]

__getattr__ = lazy_exports(__name__, _LAZY, globals())
