"""`checkpoint.intervalSteps: auto` on real gloo ranks: after the first save (at FIRST_INTERVAL_STEPS) every rank
uses the same Young/Daly interval, from the stall, step time and mean time between failures the votes agree on, and
saves at the same steps. Only rank 0 knows the MTBF (its goodput ledger); the vote shares it."""

from __future__ import annotations

from pathlib import Path

import torch
from harness import run_ranks
from torch import nn

from brain_trainer.checkpoint import CheckpointManager, TrainState, store
from brain_trainer.checkpoint.cadence import FIRST_INTERVAL_STEPS, Cadence
from brain_trainer.config import CheckpointConfig
from brain_trainer.loop import boundary
from brain_trainer.resilience.preemption import Preemption

STEPS = FIRST_INTERVAL_STEPS + 40
# 12 ms between failures: the optimum is at most that long, a handful of these steps.
MTBF_MINUTES = 0.0002


def auto_loop(rank: int, world_size: int, root: str) -> dict:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    state = TrainState(model, optim)
    cfg = CheckpointConfig(dir=root, interval_steps="auto", mtbf_minutes=MTBF_MINUTES, keep_last=100, async_save=False,
                           preemption_vote_seconds=0)
    ckpt = CheckpointManager(cfg, rank=rank, world_size=world_size, config_hash="auto")
    ckpt.restore(state)
    preemption = Preemption(cfg, rank=rank, group=ckpt.group)
    # As train.py does: rank 0 alone holds the figure.
    cadence = Cadence(cfg, mtbf_s=60 * MTBF_MINUTES if rank == 0 else 0.0, last_save=state.step, announce=rank == 0)
    decisions = []  # (step, interval in force, saved)
    for _ in range(STEPS):
        model(torch.ones(2, 4)).sum().backward()
        optim.step()
        optim.zero_grad()
        state.step += 1
        interval, stalled = cadence.interval, ckpt.stall_total_s
        boundary.after_step(state, ckpt, preemption, cadence)
        decisions.append((state.step, interval, ckpt.stall_total_s > stalled))  # a blocking save stalls the loop
    boundary.finish(state, ckpt, preemption)
    return {"decisions": decisions, "final interval": cadence.interval}


def test_every_rank_saves_at_the_same_steps_at_the_young_daly_interval(tmp_path):
    ranks = run_ranks(auto_loop, 2, str(tmp_path))
    assert ranks[0]["decisions"] == ranks[1]["decisions"]
    decisions = ranks[0]["decisions"]
    saved = [step for step, _, did in decisions if did]
    assert saved[0] == FIRST_INTERVAL_STEPS and len(saved) > 2
    # Then the interval is Young/Daly's, shorter than the first one here, and each save comes when it is due.
    assert all(interval < FIRST_INTERVAL_STEPS for step, interval, _ in decisions if step > FIRST_INTERVAL_STEPS + 1)
    last = 0
    for step, interval, did in decisions:
        assert did == (step - last >= interval), (step, interval, last)
        last = step if did else last
    committed = sorted(c.step for c in store.list_checkpoints(Path(tmp_path)) if c.manifest is not None)
    assert committed == sorted(set(saved) | {STEPS})
