"""The checkpoint cadence (brain_trainer.checkpoint.cadence.Cadence): when a save is due, fixed or Young/Daly's,
and how saves and the vote's agreed figures move it. Pure: no process group, no checkpoint."""

from __future__ import annotations

import logging
import math

import pytest

from brain_trainer.checkpoint.cadence import DEFAULT_MTBF_SECONDS, FIRST_INTERVAL_STEPS, Cadence
from brain_trainer.config import CheckpointConfig
from brain_trainer.observe.goodput import Ledger


def due_steps(cadence: Cadence, steps: range) -> list[int]:
    return [step for step in steps if cadence.due(step)]


def test_a_fixed_interval_is_due_at_its_multiples_whatever_was_saved_or_measured():
    cadence = Cadence(CheckpointConfig(interval_steps=4), mtbf_s=60.0, last_save=3)
    assert due_steps(cadence, range(1, 14)) == [4, 8, 12]
    assert cadence.figures(2.0) == ()  # nothing for the vote to agree on
    cadence.saved(5)  # a requested save in between
    cadence.update(0.1, ())
    assert (cadence.interval, due_steps(cadence, range(1, 14))) == (4, [4, 8, 12])


def test_interval_zero_and_disabled_checkpoints_are_never_due():
    assert due_steps(Cadence(CheckpointConfig(interval_steps=0)), range(0, 200)) == []
    assert due_steps(Cadence(CheckpointConfig(interval_steps=1, enabled=False)), range(0, 200)) == []
    assert due_steps(Cadence(CheckpointConfig(interval_steps="auto", enabled=False)), range(0, 200)) == []


def test_auto_first_saves_after_the_first_interval_counted_from_the_restored_step():
    assert due_steps(Cadence(CheckpointConfig(interval_steps="auto")), range(1, 120))[0] == FIRST_INTERVAL_STEPS
    restored = Cadence(CheckpointConfig(interval_steps="auto"), last_save=30)
    assert due_steps(restored, range(31, 120))[0] == 30 + FIRST_INTERVAL_STEPS


def test_auto_a_sequence_of_saves_and_votes():
    cadence = Cadence(CheckpointConfig(interval_steps="auto"), mtbf_s=3600.0)
    assert cadence.figures(0.0) == (0.0, 3600.0)
    cadence.update(0.1, (0.0, 3600.0))  # no save yet: no stall measured, the first interval stays
    assert cadence.interval == FIRST_INTERVAL_STEPS and cadence.due(50)
    cadence.saved(50)
    assert not cadence.due(51)
    cadence.update(0.0, (2.0, 3600.0))  # the first vote: no step time yet
    assert cadence.interval == FIRST_INTERVAL_STEPS
    cadence.update(0.1, (2.0, 3600.0))  # sqrt(2 x 2 x 3600) - 2 = 118 s of 0.1 s steps
    assert cadence.interval == 1180
    assert due_steps(cadence, range(51, 3000))[0] == 50 + 1180
    cadence.saved(700)  # a requested save: the interval counts from it
    assert due_steps(cadence, range(701, 3000))[0] == 700 + 1180


def test_auto_without_an_mtbf_keeps_its_interval():
    cadence = Cadence(CheckpointConfig(interval_steps="auto"))  # a rank other than 0, before the vote shares it
    cadence.update(0.1, (2.0, 0.0))
    assert cadence.interval == FIRST_INTERVAL_STEPS


@pytest.mark.parametrize("stall_s,mtbf_s,step_s,interval", [
    (1.0, 1.0, 30.0, 1),  # never below one step
    (500.0, 100.0, 4.0, 25),  # a stall beyond twice the MTBF: once per MTBF
    (10.0, 18000.0, 2.0, 295),
])
def test_auto_bounds(stall_s, mtbf_s, step_s, interval):
    cadence = Cadence(CheckpointConfig(interval_steps="auto"))
    cadence.update(step_s, (stall_s, mtbf_s))
    assert cadence.interval == interval


def test_only_an_announcing_cadence_logs_a_new_choice(caplog):
    caplog.set_level(logging.INFO, logger="brain_trainer.checkpoint.cadence")
    quiet, loud = (Cadence(CheckpointConfig(interval_steps="auto"), announce=announce) for announce in (False, True))
    for cadence in (quiet, loud, loud):  # the second update of `loud` chooses the same interval: no new line
        cadence.update(0.4, (2.1, DEFAULT_MTBF_SECONDS))
    assert quiet.interval == loud.interval == round((math.sqrt(2 * 2.1 * DEFAULT_MTBF_SECONDS) - 2.1) / 0.4)
    assert caplog.messages == [f"checkpoint interval (auto): {loud.interval} steps, by Young/Daly from a 2.1 s "
                               "checkpoint stall, 0.4 s steps and a mean time between failures of 86400 s"]


def test_for_run_takes_the_mtbf_from_rank_0s_ledger_and_says_where_it_came_from(caplog):
    caplog.set_level(logging.INFO, logger="brain_trainer.checkpoint.cadence")
    ledger = Ledger(run_id="r", started_at=0.0, updated_at=7200.0, restarts=3)
    auto = CheckpointConfig(interval_steps="auto")
    rank0 = Cadence.for_run(auto, ledger, last_save=12)
    assert (rank0.mtbf_s, rank0.last_save, rank0.announce) == (2400.0, 12, True)
    other = Cadence.for_run(auto, None, last_save=12)
    assert (other.mtbf_s, other.announce) == (0.0, False)
    assert Cadence.for_run(CheckpointConfig(interval_steps="auto", mtbf_minutes=30), ledger, last_save=0).mtbf_s == 1800
    assert Cadence.for_run(CheckpointConfig(interval_steps=5), ledger, last_save=0).interval == 5  # fixed: no line
    assert caplog.messages == [
        "checkpoint interval (auto): mean time between failures 2400 s (observed: 3 restart(s) in 7200 s)",
        "checkpoint interval (auto): mean time between failures 1800 s (checkpoint.mtbfMinutes)",
    ]
