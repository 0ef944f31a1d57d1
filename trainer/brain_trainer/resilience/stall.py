"""When a rank counts as stalled: the hang watchdog's limits, from its own step times (pure, torch-free).

A step may take `max(step_time_factor x median step time, floor_seconds)`;
the warm-up steps of every (re)start (build, restore, compile, first
collectives) get `startup_seconds` each, as does an evaluation pass, and a
checkpoint save the loop waits for gets `checkpoint_seconds`. The median is over the recent steps after the
warm-up, so one slow step does not move it much.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from typing import Optional

from ..config import WatchdogConfig

STEP, CHECKPOINT, EVALUATION = "step", "checkpoint", "evaluation"
# Step times the median is taken over: enough to ignore a few slow steps, few enough to follow a change.
WINDOW = 100


@dataclass(frozen=True)
class Limit:
    seconds: float
    why: str  # how the limit was chosen, for the log line and the termination message


def limit(cfg: WatchdogConfig, phase: str, median_step_s: Optional[float]) -> Limit:
    """The limit of the current phase; `median_step_s` is None during the warm-up steps."""
    if phase == CHECKPOINT:
        return Limit(cfg.checkpoint_seconds, "checkpointSeconds, during a checkpoint save")
    if phase == EVALUATION:
        return Limit(cfg.startup_seconds, "startupSeconds, during an evaluation pass")
    if median_step_s is None:
        return Limit(cfg.startup_seconds, "startupSeconds, during the warm-up steps")
    scaled = cfg.step_time_factor * median_step_s
    if scaled > cfg.floor_seconds:
        return Limit(scaled, f"{cfg.step_time_factor:g} x median step time {median_step_s:.3g} s")
    return Limit(cfg.floor_seconds, f"floorSeconds; {cfg.step_time_factor:g} x median step time is {scaled:.3g} s")


class StepTimes:
    """This process's step times after the warm-up steps, and their median."""

    def __init__(self, warmup_steps: int, window: int = WINDOW):
        self.warmup_steps = warmup_steps
        self.steps = 0  # steps this process completed
        self._recent: deque[float] = deque(maxlen=window)

    def add(self, seconds: float) -> None:
        self.steps += 1
        if self.steps > self.warmup_steps:
            self._recent.append(seconds)

    @property
    def warm(self) -> bool:
        """Whether a step after the warm-up has been timed (cheap: the loop asks after every step)."""
        return bool(self._recent)

    def median(self) -> Optional[float]:
        """None until the warm-up is over and one step after it has been timed."""
        return statistics.median(self._recent) if self._recent else None


def stall_message(phase: str, waited_s: float, step: int, chosen: Limit) -> str:
    """One line: what the watchdog saw, the step, and the limit with how it was chosen."""
    doing = {CHECKPOINT: "a checkpoint save did not finish", EVALUATION: "an evaluation pass did not finish"}.get(
        phase, "no optimizer step")
    return f"{doing} for {waited_s:.0f} s after step {step} (limit {chosen.seconds:.0f} s: {chosen.why})"
