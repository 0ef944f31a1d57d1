"""The preemption vote on real gloo ranks: one rank gets SIGTERM, every rank stops after the same step.

Three loops in one 2-rank run, each with its own checkpoint folder; rank 1 signals itself (a real
SIGTERM, handled by Preemption) after one step:
- votes after every step (preemption_vote_seconds 0): both ranks stop after the next step;
- votes far apart (preemption_vote_seconds 3600, so none after the first steps) with a save every 5
  steps: the vote held before the save stops both ranks there;
- votes far apart and no interval saves: the loop runs to its end, and finish() votes once more,
  so both ranks still commit the last step and exit PREEMPTED.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from harness import run_ranks
from torch import nn

from brain_trainer import contract
from brain_trainer.checkpoint import CheckpointManager, TrainState, store
from brain_trainer.checkpoint.cadence import Cadence
from brain_trainer.config import CheckpointConfig
from brain_trainer.loop import boundary
from brain_trainer.resilience.preemption import Preempted, Preemption, steps_between_votes

STEPS, SIGNAL_AFTER = 12, 2
LOOPS = {  # name: (preemption_vote_seconds, interval_steps, step every rank stops after)
    "every step": (0.0, 0, SIGNAL_AFTER + 1),
    "before a save": (3600.0, 5, 5),
    "at finish": (3600.0, 0, STEPS),
}


def _loop(rank: int, world_size: int, root: Path, vote_s: float, interval: int) -> dict:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    state = TrainState(model, optim)
    cfg = CheckpointConfig(dir=str(root), interval_steps=interval, keep_last=1, async_save=False,
                           preemption_vote_seconds=vote_s)
    ckpt = CheckpointManager(cfg, rank=rank, world_size=world_size, config_hash="vote")
    ckpt.restore(state)
    preemption = Preemption(cfg, rank=rank, group=ckpt.group)
    cadence = Cadence(cfg, last_save=state.step)
    os.environ["BRAIN_TERMINATION_LOG"] = str(root.parent / f"{root.name}-term{rank}")
    try:
        for _ in range(STEPS):
            model(torch.ones(2, 4)).sum().backward()
            optim.step()
            optim.zero_grad()
            state.step += 1
            boundary.after_step(state, ckpt, preemption, cadence)
            if state.step == SIGNAL_AFTER and rank == 1:
                os.kill(os.getpid(), signal.SIGTERM)  # handled before the next step starts
        boundary.finish(state, ckpt, preemption)
    except Preempted as stop:
        return {"code": stop.code, "step": state.step}
    return {"code": 0, "step": state.step}


def preempt_each_loop(rank: int, world_size: int, base: str) -> dict:
    before = signal.getsignal(signal.SIGTERM)
    outcome = {name: _loop(rank, world_size, Path(base) / name.replace(" ", "-"), vote_s, interval)
               for name, (vote_s, interval, _) in LOOPS.items()}
    # Every loop gave SIGTERM back to its previous handler when it ended.
    outcome["handler restored"] = signal.getsignal(signal.SIGTERM) == before
    return outcome


@pytest.fixture(scope="module")
def preempted(tmp_path_factory) -> tuple[Path, list[dict]]:
    base = tmp_path_factory.mktemp("vote")
    return base, run_ranks(preempt_each_loop, 2, str(base))


@pytest.mark.parametrize("name", list(LOOPS))
def test_every_rank_commits_the_same_step_and_exits_preempted(preempted, name):
    base, ranks = preempted
    stop = LOOPS[name][2]
    assert [r[name] for r in ranks] == [{"code": contract.PREEMPTED, "step": stop}] * 2
    root = base / name.replace(" ", "-")
    assert store.latest_checkpoint(root) == root / store.step_dir_name(stop)
    assert store.read_manifest(root / store.step_dir_name(stop))["step"] == stop
    assert all((base / f"{root.name}-term{r}").read_text()
               == contract.termination_message(contract.PREEMPTED_REASON, f"SIGTERM: step {stop} committed, exiting to be restarted")
               for r in range(2))
    assert all(r["handler restored"] for r in ranks)


@pytest.mark.parametrize("period_s,step_s,steps", [(1.0, 0.01, 100), (1.0, 3.0, 1), (0.0, 0.01, 1), (1.0, 0.0, 1),
                                                   (2.0, 0.3, 6)])
def test_steps_between_votes(period_s, step_s, steps):
    assert steps_between_votes(period_s, step_s) == steps
