"""The smallest real training run: the minimal preset on synthetic data, a few steps, checkpoints in `root`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from brain_trainer.config import TrainerConfig


def small_run(root: Path, steps: int, *, strategy: str = "single", **sections: dict[str, Any]) -> TrainerConfig:
    """`steps` optimizer steps, each logged, one checkpoint at the end; `sections` add to the config's own."""
    tree: dict[str, Any] = {
        "model": {"preset": "minimal"},
        "training": {"steps": steps, "micro_batch_size": 2, "seq_len": 16, "warmup_steps": 0, "log_interval": 1},
        "distributed": {"strategy": strategy},
        "data": {"source": "synthetic", "num_samples": 64},
        "checkpoint": {"dir": str(root), "interval_steps": 0},
        "metrics": {"port": 0},
    }
    for section, values in sections.items():
        tree[section] = {**tree.get(section, {}), **values}
    return TrainerConfig.from_dict(tree)
