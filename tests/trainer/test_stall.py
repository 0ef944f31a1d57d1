"""The hang watchdog's limits (brain_trainer.resilience.stall): pure."""

from __future__ import annotations

import pytest

from brain_trainer.config import WatchdogConfig
from brain_trainer.resilience.stall import CHECKPOINT, EVALUATION, STEP, Limit, StepTimes, limit, stall_message

CFG = WatchdogConfig(step_time_factor=10, floor_seconds=30, warmup_steps=3, startup_seconds=600, checkpoint_seconds=900)


def test_warm_up_steps_get_the_startup_limit_and_are_left_out_of_the_median():
    times = StepTimes(warmup_steps=3)
    for seconds in (120.0, 40.0, 50.0):  # build, restore, compile: slow
        times.add(seconds)
        assert times.median() is None
    assert limit(CFG, STEP, times.median()).seconds == 600
    times.add(0.5)
    assert times.median() == 0.5


def test_a_step_may_take_k_times_the_median_but_never_less_than_the_floor():
    assert limit(CFG, STEP, 0.2) == Limit(30, "floorSeconds; 10 x median step time is 2 s")
    assert limit(CFG, STEP, 12.0) == Limit(120, "10 x median step time 12 s")


def test_a_checkpoint_save_and_an_evaluation_pass_have_their_own_limits_whatever_the_step_time():
    assert limit(CFG, CHECKPOINT, 0.2).seconds == 900
    assert limit(CFG, CHECKPOINT, None).seconds == 900
    assert limit(CFG, EVALUATION, 0.2) == Limit(600, "startupSeconds, during an evaluation pass")


def test_the_median_ignores_a_few_slow_steps_and_follows_the_recent_window():
    times = StepTimes(warmup_steps=0, window=5)
    for seconds in (1.0, 1.0, 1.0, 90.0, 80.0):
        times.add(seconds)
    assert times.median() == 1.0
    for seconds in (3.0, 3.0, 3.0):  # the oldest steps leave the window
        times.add(seconds)
    assert times.median() == 3.0
    assert times.steps == 8


@pytest.mark.parametrize("phase, start", [(STEP, "no optimizer step for 31 s"), (CHECKPOINT, "a checkpoint save did not finish for 31 s"),
                                          (EVALUATION, "an evaluation pass did not finish for 31 s")])
def test_the_message_says_what_stalled_where_and_the_limit(phase, start):
    message = stall_message(phase, 31.2, 17, Limit(30, "floorSeconds"))
    assert message == f"{start} after step 17 (limit 30 s: floorSeconds)"
