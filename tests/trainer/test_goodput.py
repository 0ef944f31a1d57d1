"""The goodput ledger (brain_trainer.observe.goodput, pure) and its file (goodput_log)."""

import pytest

from brain_trainer.observe.goodput import (
    CHECKPOINT, INITIALIZATION, PRODUCTIVE, RECOMPUTED, WAITING, Ledger, summary,
)
from brain_trainer.observe.goodput_log import LEDGER_FILE, GoodputLog


def first_trainer():
    ledger = Ledger.begin(None, "uid-1", now=1000.0)
    ledger = ledger.add(INITIALIZATION, 10.0, now=1010.0)
    for step in range(1, 8):  # 2 s a step
        ledger = ledger.step(step, 2.0, now=1010.0 + 2 * step)
    return ledger.add(CHECKPOINT, 1.0, now=1025.0)


def test_a_first_run_is_its_initialisation_steps_and_saves():
    ledger = first_trainer()
    assert ledger.high_water == 7
    assert ledger.seconds[PRODUCTIVE] == 14.0 and ledger.seconds[RECOMPUTED] == 0.0
    assert ledger.wall_seconds == 25.0 and ledger.ratio == pytest.approx(14 / 25)


def test_after_a_restart_the_gap_is_waiting_and_steps_up_to_the_high_water_mark_are_recomputed():
    # The trainer died after its last entry; the next starts at 1040 and resumes from the checkpoint of step 4.
    ledger = Ledger.begin(first_trainer(), "uid-1", now=1040.0)
    assert ledger.seconds[WAITING] == 15.0 and (first_trainer().restarts, ledger.restarts) == (0, 1)
    ledger = ledger.add(INITIALIZATION, 5.0, now=1045.0)
    for step in range(5, 11):
        ledger = ledger.step(step, 2.0, now=1045.0 + 2 * (step - 4))
    assert ledger.seconds[RECOMPUTED] == 6.0  # steps 5, 6, 7 again
    assert ledger.seconds[PRODUCTIVE] == 14.0 + 6.0  # and 8, 9, 10 for the first time
    assert ledger.high_water == 10
    # Every second of the span is in one part.
    assert sum(ledger.seconds.values()) == pytest.approx(ledger.wall_seconds)


def test_another_run_or_a_damaged_file_starts_a_new_ledger():
    assert Ledger.begin(first_trainer(), "uid-2", now=5000.0) == Ledger.begin(None, "uid-2", now=5000.0)
    assert Ledger.from_dict(first_trainer().to_dict()) == first_trainer()
    for junk in (None, [], {"run_id": "x"}, {**first_trainer().to_dict(), "seconds": {"productive": "x"}}):
        assert Ledger.from_dict(junk) is None


def test_the_summary_names_every_part_in_seconds():
    shown = summary(first_trainer())
    assert (shown.ratio, shown.wall_seconds, shown.productive_seconds, shown.checkpoint_seconds) == (0.56, 25.0, 14.0, 1.0)
    assert shown.initialization_seconds == 10.0 and shown.evaluation_seconds == 0.0 and shown.waiting_seconds == 0.0
    assert summary(Ledger.begin(None, "", now=1.0)).ratio == 0.0  # no time yet


def test_the_ledger_file_carries_the_run_from_one_trainer_to_the_next(tmp_path):
    first = GoodputLog(tmp_path, "uid-1", started=1000.0)
    first.step(1, 2.0)
    first.save()
    second = GoodputLog(tmp_path, "uid-1", started=first.ledger.updated_at + 5.0)
    assert (second.ledger.restarts, second.ledger.high_water) == (1, 1)
    assert second.ledger.seconds[WAITING] == pytest.approx(5.0) and second.ledger.seconds[PRODUCTIVE] == 2.0
    # Another run in the same folder (a new job on the claim) starts its own; so does a damaged file.
    assert GoodputLog(tmp_path, "uid-2", started=1.0).ledger == Ledger.begin(None, "uid-2", now=1.0)
    (tmp_path / LEDGER_FILE).write_text("{not json")
    assert GoodputLog(tmp_path, "uid-1", started=1.0).ledger == Ledger.begin(None, "uid-1", now=1.0)
    # Ranks other than 0 keep theirs in memory only.
    GoodputLog(None, "uid-1", started=1.0).save()
    assert [p.name for p in tmp_path.iterdir()] == [LEDGER_FILE]


def test_in_pod_restarts_are_torchruns_restarts_since_the_previous_start_with_the_latest_reason():
    # The first trainer of pod 0's torchrun; that torchrun restarts its workers once, then twice more before rank 0
    # writes again (the attempt between died before its ledger).
    first = Ledger.begin(None, "uid-1", now=1000.0, agent="pod-0:1", agent_restarts=0)
    assert (first.restarts, first.in_pod_restarts, first.last_in_pod_restart) == (0, 0, "")
    once = Ledger.begin(first.add(INITIALIZATION, 5.0, now=1005.0), "uid-1", now=1010.0, agent="pod-0:1",
                        agent_restarts=1, restarted_after="error: RuntimeError: boom")
    assert (once.restarts, once.in_pod_restarts, once.last_in_pod_restart) == (1, 1, "error: RuntimeError: boom")
    assert once.seconds[WAITING] == 5.0  # what the failed attempt lost after its last entry, and the restart
    thrice = Ledger.begin(once, "uid-1", now=1020.0, agent="pod-0:1", agent_restarts=3,
                          restarted_after="out-of-memory: MemoryError")
    # The attempt that left no entry is a restart too: torchrun counted it.
    assert (thrice.restarts, thrice.in_pod_restarts, thrice.last_in_pod_restart) == (3, 3, "out-of-memory: MemoryError")
    # The same torchrun restarting for a peer pod's failure (a membership change: its count stays): in-pod too.
    peer = Ledger.begin(thrice, "uid-1", now=1025.0, agent="pod-0:1", agent_restarts=3,
                        restarted_after="preempted: SIGTERM: step 4 committed")
    assert (peer.restarts, peer.in_pod_restarts, peer.last_in_pod_restart) == (4, 4, "preempted: SIGTERM: step 4 committed")
    # A replaced pod's new torchrun: a restart, not an in-pod one.
    replaced = Ledger.begin(peer, "uid-1", now=1030.0, agent="pod-0:7", agent_restarts=0)
    assert (replaced.restarts, replaced.in_pod_restarts, replaced.last_in_pod_restart) == (5, 4, peer.last_in_pod_restart)
    # Without a ledger on disk (no checkpoint folder) torchrun's count is all there is, and it is a restart too.
    alone = Ledger.begin(None, "uid-1", now=1.0, agent="pod-0:1", agent_restarts=2, restarted_after="error: x")
    assert (alone.restarts, alone.in_pod_restarts) == (2, 2)
    # A ledger an older trainer wrote (no in-pod fields) continues with none counted.
    old = {key: value for key, value in once.to_dict().items()
           if key not in ("in_pod_restarts", "last_in_pod_restart", "agent", "agent_restarts")}
    assert Ledger.from_dict(old) == Ledger(**{**old, "seconds": once.seconds})
    assert Ledger.from_dict(once.to_dict()) == once
