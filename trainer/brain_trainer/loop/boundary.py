"""What happens between two optimizer steps for checkpoints: the preemption vote, then a save if one is due.

The vote (resilience/preemption.py) and the saves (checkpoint/manager.py) know
nothing of each other; these two functions put them in order, on every rank
at the same steps.
"""

from __future__ import annotations

import logging

from ..checkpoint import CheckpointManager, TrainState
from ..contract import PREEMPTED
from ..resilience.preemption import Preemption

log = logging.getLogger(__name__)


def after_step(state: TrainState, ckpt: CheckpointManager, preemption: Preemption) -> None:
    """After every optimizer step: vote when the vote or a save is due (a save is collective anyway), then save."""
    vote = None
    if preemption.due(state.step) or ckpt.due(state.step):
        vote = preemption.vote(state.step, ckpt.last_stall_s)
        if vote.stop:
            _leave(state, ckpt, preemption)
    ckpt.after_step(state, vote)


def finish(state: TrainState, ckpt: CheckpointManager, preemption: Preemption) -> None:
    """The final save, after one more vote: a SIGTERM since the last one still ends the trainer PREEMPTED."""
    vote = preemption.vote(state.step, ckpt.last_stall_s) if preemption.enabled else None
    if vote is not None and vote.stop:
        _leave(state, ckpt, preemption)
    ckpt.finish(state, vote)
    preemption.close()


def _leave(state: TrainState, ckpt: CheckpointManager, preemption: Preemption) -> None:
    if ckpt.rank == 0:
        log.warning("SIGTERM: saving step %d before exiting with code %d", state.step, PREEMPTED)
    ckpt.finish(state)
    preemption.leave(state.step)
