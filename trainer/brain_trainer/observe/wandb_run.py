"""A Weights & Biases run for Trackers, through wandb's client; `offline` writes it to files only."""

from __future__ import annotations

import os
from typing import Any, Mapping

from .trackers import Start

STEP = "trainer/step"  # every scalar's x axis: a restarted job logs its steps after the checkpoint again
# The client's own defaults that training needs changed; a tracker's `settings` may say otherwise: no banner nor
# retry chatter, the pod's log left alone, and a start that gives up on an unreachable server within a minute.
CLIENT_DEFAULTS: dict[str, Any] = {"silent": True, "console": "off", "init_timeout": 60}


class WandbRun:
    def __init__(self, run):
        self._run = run

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log({**metrics, STEP: step})

    def close(self) -> None:
        self._run.finish()


def open_wandb(start: Start) -> tuple[WandbRun, str]:
    """Continues `start.run_id` (wandb's resume="allow"), else starts a run; the parameters go in its config."""
    os.environ.setdefault("WANDB_SILENT", "true")  # read before the settings are
    import wandb

    config = start.config
    folder = start.folder  # wandb keeps its files in a wandb/ folder here (offline runs until synced)
    run = wandb.init(
        project=config.project, entity=config.entity, name=start.name, id=start.run_id,
        resume="allow" if start.run_id else None, mode="offline" if config.offline else None,
        dir=str(folder) if folder is not None else None, tags=[f"{k}:{v}" for k, v in start.tags.items()],
        settings=wandb.Settings(**{**CLIENT_DEFAULTS, **config.settings}),
    )
    run.config.update(dict(start.params), allow_val_change=True)
    run.define_metric(STEP)
    run.define_metric("*", step_metric=STEP)
    return WandbRun(run), run.id
