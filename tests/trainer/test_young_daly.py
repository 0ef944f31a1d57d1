"""Young/Daly's checkpoint interval (brain_trainer.checkpoint.cadence's pure functions)."""

import math

import pytest

from brain_trainer.checkpoint.cadence import DEFAULT_MTBF_SECONDS, FIRST_INTERVAL_STEPS, choose_mtbf, interval_seconds, interval_steps


def test_daly_is_youngs_square_root_less_the_stall():
    # A 10 s stall and a failure every 5 hours: sqrt(2 x 10 x 18000) - 10 = 590 s.
    assert interval_seconds(10.0, 5 * 3600.0) == pytest.approx(590.0)
    assert interval_seconds(2.0, 3600.0) == pytest.approx(math.sqrt(2 * 2 * 3600) - 2)


def test_the_interval_minimises_the_expected_waste():
    stall, mtbf = 4.0, 7200.0
    best = interval_seconds(stall, mtbf)

    def waste(tau):  # per second of work: saving, plus half an interval lost per failure
        return stall / tau + (tau + stall) / (2 * mtbf)

    assert waste(best) < waste(0.8 * best) and waste(best) < waste(1.25 * best)


def test_a_stall_longer_than_twice_the_mtbf_checkpoints_once_per_mtbf():
    assert interval_seconds(500.0, 100.0) == 100.0


def test_in_steps_at_least_one():
    assert interval_steps(10.0, 18000.0, 2.0) == 295
    assert interval_steps(1.0, 1.0, 30.0) == 1
    assert interval_steps(1.0, 100.0, 0.0) == FIRST_INTERVAL_STEPS  # no step time yet


def test_the_mtbf_is_the_setting_else_the_runs_own_once_it_failed_else_a_day():
    assert choose_mtbf(30.0, 7200.0, 3) == (1800.0, "checkpoint.mtbfMinutes")
    assert choose_mtbf(None, 7200.0, 3) == (2400.0, "observed: 3 restart(s) in 7200 s")
    assert choose_mtbf(None, 7200.0, 0) == (DEFAULT_MTBF_SECONDS, "default: no failure yet") == (86400.0, "default: no failure yet")
