"""Rank 0's TensorBoard scalars (`metrics.tensorboard_dir`), written with torch.utils.tensorboard."""

from __future__ import annotations

import math
from typing import Optional

from torch.utils.tensorboard import SummaryWriter

from .scalar_tags import TAGS


class Scalars:
    """One event file per (re)start; `first_step` is the first step it will write."""

    def __init__(self, folder: str, first_step: int):
        # A restarted run writes again the steps after its checkpoint: TensorBoard drops the
        # earlier files' events from `first_step` on, so each step shows once.
        self._writer = SummaryWriter(log_dir=folder, purge_step=first_step)

    def write(self, step: int, **values: Optional[float]) -> None:
        for key, value in values.items():
            if value is not None and not math.isnan(value):
                self._writer.add_scalar(TAGS[key], value, step)
        self._writer.flush()  # at logging steps only: cheap, and a crash loses nothing logged

    def close(self) -> None:
        self._writer.close()
