"""A torch.profiler trace of the steps `profiling` names, on every rank (the Reporter calls it at each step end).

The profiler's own step schedule marks each optimizer step in the trace
(`ProfilerStep#<n>`, n the optimizer step: skip_first moves its count to the
loop's), warming up one step first where the run has one to spare. Each rank
writes a gzipped Chrome trace, `<checkpoint dir>/profiles/step-<start>/rank-<r>.json.gz`,
which Perfetto (ui.perfetto.dev), chrome://tracing and TensorBoard's profiler open.
A run without `startStep` never builds a profiler.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from ..config import ProfilingConfig

log = logging.getLogger(__name__)

PROFILES = "profiles"
ACTIVITIES = {"cpu": ProfilerActivity.CPU, "cuda": ProfilerActivity.CUDA}


def profile_folder(root: Path, start_step: int) -> Path:
    return root / PROFILES / f"step-{start_step}"


class StepProfiler:
    """Traces steps start..start+steps-1 of a run whose loop computes `first_step` + 1 next."""

    def __init__(self, cfg: ProfilingConfig, root: Path, rank: int, first_step: int):
        start = cfg.start_step
        assert start is not None
        self.folder = profile_folder(root, start)
        self.path = self.folder / f"rank-{rank}.json.gz"
        self.written = False
        self._rank = rank
        warmup = 1 if start - 2 >= first_step else 0
        self._begin_after = start - 1 - warmup  # the step after which the profiler starts
        self._profiler: Optional[profile] = None
        if first_step >= start:  # resumed past the window: nothing to trace
            self._begin_after = -1
            return
        activities = [ACTIVITIES[a] for a in cfg.activities if a != "cuda" or torch.cuda.is_available()]
        self._profiler = profile(
            activities=activities, record_shapes=cfg.record_shapes, profile_memory=cfg.memory,
            schedule=schedule(skip_first=start - warmup, wait=0, warmup=warmup, active=cfg.steps, repeat=1),
            on_trace_ready=self._write,
        )
        # The schedule counts, and each ProfilerStep#<n> names, optimizer steps: n is the step about to run.
        self._profiler.step_num = start - warmup
        self._profiler.current_action = self._profiler.schedule(self._profiler.step_num)
        if first_step == self._begin_after:
            self._profiler.start()

    @property
    def busy(self) -> bool:
        """Its window is still to come or under way."""
        return self._profiler is not None

    def stepped(self, step: int) -> None:
        """Step `step` ended: start the profiler before the window, mark each step in it, stop after it."""
        if self._profiler is None:
            return
        if step == self._begin_after:
            self._profiler.start()
        elif step > self._begin_after:
            self._profiler.step()
            if self.written:
                self.close()

    def close(self) -> None:
        """Stops a profiler still running (the run ended inside the window: its trace is written then)."""
        profiler, self._profiler = self._profiler, None
        if profiler is not None and profiler.profiler is not None:
            profiler.stop()

    def _write(self, profiler: profile) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(self.path))
        self.written = True
        if self._rank == 0:
            log.info("profile written: %s/rank-*.json.gz (every rank's trace)", self.folder)
