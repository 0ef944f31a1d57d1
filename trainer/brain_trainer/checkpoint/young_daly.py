"""The checkpoint interval that loses the least time (pure): Young's and Daly's rule.

Checkpointing every tau seconds costs delta (the loop's stall per save) every
tau, and a failure loses tau / 2 of work on average; with a mean time between
failures M the waste is smallest at tau = sqrt(2 delta M) - delta (Daly 2006,
first order; Young 1974 without the - delta), for delta < 2 M; beyond that,
tau = M.
"""

from __future__ import annotations

import math
from typing import Optional

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
