"""Opt-in record of the samples each optimizer step consumed, to prove resumes exact.

With BRAIN_SAMPLE_LOG=PATH every rank appends one JSON line per optimizer step
to PATH: {"attempt", "rank", "step", "samples"} where samples are the dataset
indices the rank read for that step, in order. An attempt is one start of the
worker group (torchrun agent pid + restart count); a resumed attempt re-records
the steps after its checkpoint, so for each step the last attempt's lines count.
Off (no wrapping, no writes) when the variable is unset.
"""

from __future__ import annotations

import json
import os
from typing import Any

from torch.utils.data import Dataset

from ..contract import restart_count

SAMPLE_LOG_ENV = "BRAIN_SAMPLE_LOG"


class _Recording(Dataset):
    def __init__(self, dataset: Dataset, seen: list[int]):
        self.dataset = dataset
        self.seen = seen

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        self.seen.append(int(index))
        return self.dataset[index]


class SampleLog:
    def __init__(self, path: str | None, rank: int):
        self.path = path
        self.rank = rank
        self.attempt = f"{os.getppid()}-{restart_count()}"
        self._seen: list[int] = []

    @classmethod
    def from_env(cls, rank: int) -> "SampleLog":
        return cls(os.environ.get(SAMPLE_LOG_ENV) or None, rank)

    def wrap(self, dataset: Dataset) -> Dataset:
        """The dataset, recording each index read (only in-process loading: data.num_workers 0)."""
        return _Recording(dataset, self._seen) if self.path else dataset

    def record(self, step: int) -> None:
        """Append the indices read since the previous step as this step's."""
        if not self.path:
            return
        line = json.dumps({"attempt": self.attempt, "rank": self.rank, "step": step, "samples": self._seen})
        with open(self.path, "a") as f:  # O_APPEND: ranks' lines never interleave mid-line
            f.write(line + "\n")
        self._seen.clear()
