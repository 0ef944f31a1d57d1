"""The learning-rate schedule: warmup, cosine decay to the floor, linear batch scaling."""

import math

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR

from brain_trainer.config import TrainingConfig
from brain_trainer.loop.schedule import WarmupCosine, follow_config, peak_learning_rate


def test_warmup_rises_linearly_to_the_peak():
    s = WarmupCosine(warmup_steps=4, total_steps=20, min_lr_ratio=0.1)
    assert [s(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert s(4) == 1.0  # decay starts from the peak


def test_cosine_reaches_the_floor_at_the_last_step_and_stays_there():
    s = WarmupCosine(warmup_steps=2, total_steps=12, min_lr_ratio=0.1)
    assert s(7) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway through the decay
    assert s(12) == pytest.approx(0.1)
    assert s(50) == pytest.approx(0.1)
    values = [s(i) for i in range(2, 13)]
    assert all(a > b for a, b in zip(values, values[1:]))


def test_no_warmup_starts_at_the_peak():
    s = WarmupCosine(warmup_steps=0, total_steps=10, min_lr_ratio=0.0)
    assert s(0) == 1.0 and s(10) == pytest.approx(0.0) and s(5) == pytest.approx(0.5)


def test_from_config_and_through_lambdalr():
    cfg = TrainingConfig(steps=10, warmup_steps=2, min_lr_ratio=0.2, learning_rate=1e-3)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.learning_rate)
    sched = LambdaLR(opt, WarmupCosine.from_config(cfg))
    lrs = []
    for _ in range(10):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(5e-4) and lrs[1] == pytest.approx(1e-3)
    assert sched.get_last_lr()[0] == pytest.approx(2e-4)
    restored = LambdaLR(opt, WarmupCosine.from_config(cfg))
    restored.load_state_dict(sched.state_dict())
    assert restored.get_last_lr() == sched.get_last_lr()


@pytest.mark.parametrize("scaling,batch,expected", [("none", 512, 3e-4), ("linear", 512, 6e-4), ("linear", 64, 7.5e-5)])
def test_linear_scaling_by_effective_batch(scaling, batch, expected):
    cfg = TrainingConfig(learning_rate=3e-4, lr_scaling=scaling, reference_batch_size=256)
    assert math.isclose(peak_learning_rate(cfg, batch), expected)


def _lambda_lr(total_steps: int, peak: float) -> LambdaLR:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    return LambdaLR(optimizer, WarmupCosine(warmup_steps=2, total_steps=total_steps, min_lr_ratio=0.1))


def test_a_resume_with_more_steps_stretches_the_decay():
    saved = _lambda_lr(total_steps=10, peak=1.0)
    for _ in range(6):
        saved.optimizer.step()
        saved.step()
    state = saved.state_dict()

    same = _lambda_lr(total_steps=10, peak=1.0)
    same.load_state_dict(state)
    follow_config(same, WarmupCosine(2, 10, 0.1), peak_lr=1.0)
    assert same.get_last_lr() == saved.get_last_lr()  # an unchanged config resumes exactly
    same.optimizer.step()
    same.step()
    saved.optimizer.step()
    saved.step()
    assert same.get_last_lr() == saved.get_last_lr()

    longer = _lambda_lr(total_steps=20, peak=2.0)
    longer.load_state_dict(state)  # restores the old schedule object and base LR ...
    follow_config(longer, WarmupCosine(2, 20, 0.1), peak_lr=2.0)  # ... which this run's config replaces
    assert longer.optimizer.param_groups[0]["lr"] == 2.0 * WarmupCosine(2, 20, 0.1)(6)
    longer.optimizer.step()
    longer.step()
    assert longer.get_last_lr() == [2.0 * WarmupCosine(2, 20, 0.1)(7)]
