"""What happens between two optimizer steps for checkpoints: the preemption vote, then a save if one is due.

The cadence (checkpoint/cadence.py: when a save is due), the vote
(resilience/preemption.py: SIGTERM, requests, figures agreed across ranks) and
the saves (checkpoint/manager.py) know nothing of each other; these two
functions put them in order, on every rank at the same steps.
"""

from __future__ import annotations

import logging

from ..checkpoint import CheckpointManager, TrainState
from ..checkpoint.cadence import Cadence
from ..contract import PREEMPTED
from ..resilience.preemption import Preemption

log = logging.getLogger(__name__)


def after_step(state: TrainState, ckpt: CheckpointManager, preemption: Preemption, cadence: Cadence) -> int:
    """After every optimizer step: vote when the vote or a save is due (a save is collective anyway), then save.
    Returns the steps of a profile the ranks agreed to take from the next step on (0: none)."""
    due = cadence.due(state.step)
    request, profile_steps = None, 0
    if preemption.due(state.step) or due:
        vote = preemption.vote(state.step, cadence.figures(ckpt.last_stall_s))
        if vote.stop:
            _leave(state, ckpt, preemption)
        cadence.update(vote.step_s, vote.figures)
        request, profile_steps = vote.request, vote.profile_steps
    save = due or request is not None
    ckpt.after_step(state, save=save, request=request)
    if save:
        cadence.saved(state.step)
    return profile_steps


def finish(state: TrainState, ckpt: CheckpointManager, preemption: Preemption) -> None:
    """The final save, after one more vote: a SIGTERM since the last one still ends the trainer PREEMPTED."""
    vote = preemption.vote(state.step) if preemption.enabled else None
    if vote is not None and vote.stop:
        _leave(state, ckpt, preemption)
    ckpt.finish(state, vote.request if vote is not None else None)
    preemption.close()


def _leave(state: TrainState, ckpt: CheckpointManager, preemption: Preemption) -> None:
    if ckpt.rank == 0:
        log.warning("SIGTERM: saving step %d before exiting with code %d", state.step, PREEMPTED)
    ckpt.finish(state)
    preemption.leave(state.step)
