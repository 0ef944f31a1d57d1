"""When the next checkpoint is due (torch-free): every `intervalSteps` steps, or Young's and Daly's interval.

Checkpointing every tau seconds costs delta (the loop's stall per save) every
tau, and a failure loses tau / 2 of work on average; with a mean time between
failures M the waste is smallest at tau = sqrt(2 delta M) - delta (Daly 2006,
first order; Young 1974 without the - delta), for delta < 2 M; beyond that,
tau = M.

The pure functions compute; `Cadence` holds one run's interval. The loop's
boundary asks it `due(step)`, tells it `saved(step)`, and hands it what the
ranks agreed in the preemption vote (`figures` goes into the vote, `update`
takes the agreed maxima out), so every rank chooses the same interval.
"""

from __future__ import annotations

import logging
import math
from typing import Optional, Sequence

from ..config import AUTO, CheckpointConfig
from ..observe.goodput import Ledger

log = logging.getLogger(__name__)

# Until one is measured (no failure yet, no mtbfMinutes): a day.
DEFAULT_MTBF_SECONDS = 24 * 3600.0
# Until the first save's stall is measured, `intervalSteps: auto` saves after this many steps.
FIRST_INTERVAL_STEPS = 50


def interval_seconds(stall_s: float, mtbf_s: float) -> float:
    """Daly's optimum: seconds of training between two checkpoints."""
    if stall_s >= 2 * mtbf_s:
        return mtbf_s
    return math.sqrt(2 * stall_s * mtbf_s) - stall_s


def interval_steps(stall_s: float, mtbf_s: float, step_s: float) -> int:
    """The optimum in whole steps, at least one."""
    if step_s <= 0:
        return FIRST_INTERVAL_STEPS
    return max(1, round(interval_seconds(stall_s, mtbf_s) / step_s))


def choose_mtbf(mtbf_minutes: Optional[float], wall_s: float, restarts: int) -> tuple[float, str]:
    """Seconds between failures, and where the figure comes from: the setting, else the run's own (its wall time
    over its restarts, from the goodput ledger) once it has restarted, else DEFAULT_MTBF_SECONDS."""
    if mtbf_minutes is not None:
        return 60 * mtbf_minutes, "checkpoint.mtbfMinutes"
    if restarts > 0:
        return wall_s / restarts, f"observed: {restarts} restart(s) in {wall_s:.0f} s"
    return DEFAULT_MTBF_SECONDS, "default: no failure yet"


class Cadence:
    """One run's checkpoint interval: fixed (`intervalSteps` N; 0: none) or auto (Young/Daly, re-chosen at votes).

    A fixed interval saves at the multiples of N; an auto one `interval` steps after the previous save (or the
    restored checkpoint, `last_save`). `mtbf_s` is rank 0's figure (only its goodput ledger knows the run's
    failures); other ranks pass 0 and learn it from the vote. `announce`: log each new choice (rank 0).
    """

    def __init__(self, cfg: CheckpointConfig, *, mtbf_s: float = 0.0, last_save: int = 0, announce: bool = False):
        self.enabled = cfg.enabled
        self.auto = cfg.interval_steps == AUTO
        self.interval = FIRST_INTERVAL_STEPS if self.auto else int(cfg.interval_steps)
        self.mtbf_s = mtbf_s
        self.last_save = last_save
        self.announce = announce

    @classmethod
    def for_run(cls, cfg: CheckpointConfig, ledger: Optional[Ledger], *, last_save: int) -> "Cadence":
        """The trainer's: the MTBF from the setting or `ledger` (rank 0's; None on the other ranks), said once."""
        if ledger is None:
            return cls(cfg, last_save=last_save)
        mtbf_s, source = choose_mtbf(cfg.mtbf_minutes, ledger.wall_seconds, ledger.restarts)
        cadence = cls(cfg, mtbf_s=mtbf_s, last_save=last_save, announce=True)
        if cadence.enabled and cadence.auto:
            log.info("checkpoint interval (auto): mean time between failures %.0f s (%s)", mtbf_s, source)
        return cadence

    def due(self, step: int) -> bool:
        """Whether `step` is a save step of the interval (a request or SIGTERM may add others)."""
        if not self.enabled:
            return False
        if self.auto:
            return step - self.last_save >= self.interval
        return bool(self.interval) and step % self.interval == 0

    def saved(self, step: int) -> None:
        """A checkpoint of `step` was saved (due or requested): an auto interval counts from here."""
        self.last_save = step

    def figures(self, stall_s: float) -> tuple[float, ...]:
        """This rank's figures for the vote to agree on (the maximum over ranks): the latest save's stall and the
        MTBF under auto; nothing for a fixed interval."""
        return (stall_s, self.mtbf_s) if self.auto else ()

    def update(self, step_s: float, agreed: Sequence[float]) -> None:
        """After a vote: Young/Daly's interval from the agreed `figures` and step time, once a stall is measured."""
        if not self.auto or step_s <= 0:
            return
        stall_s, mtbf_s = agreed
        if stall_s <= 0 or mtbf_s <= 0:
            return
        chosen = interval_steps(stall_s, mtbf_s, step_s)
        if chosen != self.interval and self.announce:
            log.info("checkpoint interval (auto): %d steps, by Young/Daly from a %.3g s checkpoint stall, %.3g s steps "
                     "and a mean time between failures of %.0f s", chosen, stall_s, step_s, mtbf_s)
        self.interval = chosen
