"""The checkpoint volume's lease and fencing generation (checkpoint/lease.py, docs/checkpoints.md).

The decision is pure; the files are raced by two processes; fencing is two CheckpointManagers on one folder
(an old group and the newer one); a refusal reaches every rank of a gloo group; a run releases the volume
however it ends; a killed holder's lease expires and is taken over.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from harness import run_ranks
from processes import start
from small_runs import small_run
from torch import nn

from brain_trainer import contract
from brain_trainer.checkpoint import CheckpointManager, TrainState, store
from brain_trainer.checkpoint import lease
from brain_trainer.checkpoint.lease import EXPIRED, FIRST, REFUSED, RELEASED, SAME_HOLDER, Record, decide
from brain_trainer.config import CheckpointConfig
from brain_trainer.loop.train import train
from brain_trainer.resilience.failures import Fatal
from brain_trainer.schema import ConfigError

A, B = "job writer-a (/runs/writer-a)", "job writer-b (/runs/writer-b)"
DEADLINE_S = 60.0


# -- the decision --


def test_the_first_start_takes_generation_one():
    assert decide(None, A, 100.0, 60.0) == (FIRST, Record(1, A, 100.0, 100.0, 60.0))


@pytest.mark.parametrize("newest, holder, now, how", [
    (Record(4, A, 10.0, 90.0, 60.0), A, 100.0, SAME_HOLDER),  # a torchrun restart, a replaced pod: at once
    (Record(4, A, 10.0, 90.0, 60.0, released=True), B, 100.0, RELEASED),  # the holder ended or was preempted
    (Record(4, A, 10.0, 90.0, 60.0), B, 150.0, EXPIRED),  # not renewed for its TTL: crashed or cut off
])
def test_a_new_group_takes_over_with_the_next_generation(newest, holder, now, how):
    took, record = decide(newest, holder, now, 30.0)
    assert took == how and record is not None
    assert (record.generation, record.holder, record.renewed, record.ttl_s, record.released) == (5, holder, now, 30.0, False)
    assert record.since == (10.0 if how == SAME_HOLDER else now)  # "in use since" spans a holder's own restarts


def test_a_live_foreign_lease_is_refused():
    assert decide(Record(4, A, 10.0, 90.0, 60.0), B, 149.9, 60.0) == (REFUSED, None)


def test_renewal_and_release_move_only_the_renewal_time():
    record = Record(4, A, 10.0, 90.0, 60.0)
    assert lease.renewed(record, 95.0) == Record(4, A, 10.0, 95.0, 60.0)
    assert lease.released(record, 96.0) == Record(4, A, 10.0, 96.0, 60.0, released=True)


def test_the_refusal_names_the_place_the_holder_and_since_when():
    line = lease.refusal_line(Record(3, A, 0.0, 30.0, 60.0), "checkpoint claim shared (/ckpt)", 40.0)
    assert line.startswith("checkpoint claim shared (/ckpt) is in use by job writer-a (/runs/writer-a) since "
                           "1970-01-01T00:00:00Z (lease generation 3, renewed 10 s ago, expires at 1970-01-01T00:01:30Z")


# -- the files: one winner of a race --


def _volume_lease(root: Path, holder: str, ttl_s: float = 60.0) -> lease.VolumeLease:
    return lease.VolumeLease(root, ttl_s, rank=0, env={contract.LEASE_HOLDER_ENV: holder})


def _race(root: str, holder: str, barrier, results) -> None:
    lost = _volume_lease(Path(root), holder)
    barrier.wait()
    results.put((holder, lost._take()))


def test_two_starters_at_once_one_takes_the_volume_and_the_other_is_refused_naming_it(tmp_path):
    forked = multiprocessing.get_context("fork")
    for attempt in range(5):  # each attempt its own folder: the processes meet at a barrier, then both take
        root = tmp_path / str(attempt)
        barrier, results = forked.Barrier(2), forked.Queue()
        procs = [forked.Process(target=_race, args=(str(root), holder, barrier, results)) for holder in (A, B)]
        for proc in procs:
            proc.start()
        outcome = dict(results.get(timeout=DEADLINE_S) for _ in procs)
        for proc in procs:
            proc.join(DEADLINE_S)
        (winner,) = [holder for holder, refusal in outcome.items() if refusal is None]
        (refusal,) = [refusal for refusal in outcome.values() if refusal is not None]
        assert f"is in use by {winner} since " in refusal
        assert lease.generations(root) == [1] and lease.read_newest(root).holder == winner


def test_a_starter_that_lost_the_race_reads_again(tmp_path, monkeypatch):
    # B read "no lease" just before A created generation 1: B's create fails, B reads again and is refused.
    _volume_lease(tmp_path, A)._take()
    reads = iter([None])
    real = lease.read_newest
    monkeypatch.setattr(lease, "read_newest", lambda root: next(reads, real(root)))
    refusal = _volume_lease(tmp_path, B)._take()
    assert refusal is not None and f"in use by {A}" in refusal
    assert lease.generations(tmp_path) == [1]


# -- fencing: two groups on one folder --


def _state() -> TrainState:
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    return TrainState(model, torch.optim.AdamW(model.parameters()))


def _step(state: TrainState) -> None:
    state.model(torch.ones(2, 8)).sum().backward()
    state.optimizer.step()
    state.optimizer.zero_grad()
    state.step += 1


def _group(root: Path, holder: str, monkeypatch, async_save: bool = False) -> tuple[CheckpointManager, TrainState]:
    monkeypatch.setenv(contract.LEASE_HOLDER_ENV, holder)
    cfg = CheckpointConfig(dir=str(root), interval_steps=1, keep_last=5, async_save=async_save)
    ckpt = CheckpointManager(cfg, rank=0, world_size=1, config_hash="lease")
    state = _state()
    ckpt.restore(state)
    return ckpt, state


@pytest.mark.parametrize("async_save", [False, True])
def test_an_older_groups_commit_is_refused_after_a_newer_group_took_the_volume(tmp_path, monkeypatch, async_save):
    old, old_state = _group(tmp_path, A, monkeypatch, async_save)
    new, new_state = _group(tmp_path, A, monkeypatch)  # the same job's new group (a replaced pod): generation 2
    _step(old_state)
    with pytest.raises(Fatal) as refused:
        old.after_step(old_state, save=True)  # a blocking save commits here; an asynchronous one in the background...
        old.wait()  # ...whose refusal the next wait re-raises
    assert refused.value.reason == contract.FENCED == "fenced"
    assert refused.value.line == (f"checkpoint folder {tmp_path} was taken over by {A} (generation 2); this worker "
                                  "group (generation 1) stops without committing")
    assert store.list_checkpoints(tmp_path) == []
    old.close(wait=False)

    _step(new_state)
    new.after_step(new_state, save=True)
    new.finish(new_state)
    (committed,) = store.list_checkpoints(tmp_path)
    assert committed.manifest["lease"] == {"holder": A, "generation": 2}


def test_a_finished_job_releases_the_volume_and_another_job_takes_it_at_once(tmp_path, monkeypatch):
    first, state = _group(tmp_path, A, monkeypatch)
    _step(state)
    first.finish(state)
    assert lease.read_newest(tmp_path).released
    second, state = _group(tmp_path, B, monkeypatch)  # would be refused if the lease were live
    assert lease.generations(tmp_path) == [2] and lease.read_newest(tmp_path).holder == B
    second.close()


def _wait_for(condition, what: str) -> None:
    """Poll a condition of the files (not a clock): the test's deadline is the only time in it."""
    done = multiprocessing.Event()
    for _ in range(int(DEADLINE_S * 100)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError(f"gave up waiting for {what}")


def test_the_renewals_keep_the_lease_and_find_a_newer_generation(tmp_path):
    held = _volume_lease(tmp_path, A, ttl_s=0.2)
    held.acquire(lambda refusal: refusal)
    taken = lease.read_newest(tmp_path).renewed
    _wait_for(lambda: lease.read_newest(tmp_path).renewed > taken, "a renewal")
    assert lease.create(tmp_path, Record(2, B, 0.0, 0.0, 60.0))
    _wait_for(lambda: held.fenced is not None, "the renewal thread to notice generation 2")
    with pytest.raises(Fatal, match="taken over by job writer-b"):
        held.raise_if_fenced()
    held.stop()


# -- every rank refused, before any step --


def _refused(rank: int, world_size: int, root: str) -> dict:
    os.environ[contract.CHECKPOINT_CLAIM_ENV] = "shared-ckpt"
    os.environ[contract.LEASE_HOLDER_ENV] = B
    ckpt = CheckpointManager(CheckpointConfig(dir=root), rank=rank, world_size=world_size, config_hash="lease")
    try:
        ckpt.restore(_state())
    except Fatal as refused:
        return {"reason": refused.reason, "line": refused.line}
    finally:
        ckpt.close(wait=False)
    return {"reason": None}


def test_a_live_lease_of_another_job_refuses_every_rank_with_config_error(tmp_path):
    live = lease.decide(None, A, time.time(), 600.0)[1]
    assert lease.create(tmp_path, live)
    ranks = run_ranks(_refused, 2, str(tmp_path))
    assert [r["reason"] for r in ranks] == [contract.CONFIG_ERROR_REASON] * 2
    assert ranks[0]["line"] == ranks[1]["line"]
    assert ranks[0]["line"].startswith(f"checkpoint claim shared-ckpt ({tmp_path}) is in use by {A} since ")
    assert lease.generations(tmp_path) == [1] and lease.read_newest(tmp_path).holder == A


# -- a run releases the volume however it ends --

# How the first run ends: what train raises, and the checkpoint settings that make it end so.
ENDINGS = {
    "finishes": (None, {}),
    "fails in a step": (RuntimeError, {}),
    "stops on SIGTERM": (SystemExit, {}),  # the preemption checkpoint, then exit 75
    "refuses its config after taking the lease": (ConfigError, {"resume_from": 7}),  # no step 7 committed
}


def _ending_in_the_second_step(monkeypatch, ending: str) -> None:
    """The run's loss function, at its second call (step 2's forward), fails or gets SIGTERM as `ending` says."""
    step = importlib.import_module("brain_trainer.loop.loss")  # where the step settings take the loss from
    real, calls = step.loss_fn, []

    def loss_fn(logits, targets):
        calls.append(None)
        if len(calls) == 2 and ending == "fails in a step":
            raise RuntimeError("a step failed")
        if len(calls) == 2 and ending == "stops on SIGTERM":
            os.kill(os.getpid(), signal.SIGTERM)  # the trainer's handler notes it; the next vote stops the run
        return real(logits, targets)

    monkeypatch.setattr(step, "loss_fn", loss_fn)


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_a_run_releases_the_volume_however_it_ends_and_another_job_takes_it_at_once(tmp_path, monkeypatch, ending):
    raised, checkpoint = ENDINGS[ending]
    monkeypatch.setenv(contract.TERMINATION_LOG_ENV, str(tmp_path / "termination-log"))
    monkeypatch.setenv(contract.LEASE_HOLDER_ENV, A)
    _ending_in_the_second_step(monkeypatch, ending)
    root = tmp_path / "ckpt"
    with pytest.raises(raised) if raised else contextlib.nullcontext() as ended:
        train(small_run(root, 2, checkpoint=checkpoint))
    if ending == "stops on SIGTERM":
        assert ended.value.code == contract.PREEMPTED
    first = lease.read_newest(root)
    assert (first.holder, first.released) == (A, True)

    taker = _volume_lease(root, B)  # another job's run, right after: no refusal (Fatal config-error)
    taker.acquire(lambda refusal: refusal)
    assert (lease.read_newest(root).holder, lease.generations(root)) == (B, [first.generation + 1])
    taker.release()


def test_a_fenced_group_that_fails_does_not_release_the_newer_groups_lease(tmp_path, monkeypatch):
    old, _ = _group(tmp_path, A, monkeypatch)
    new, _ = _group(tmp_path, A, monkeypatch)  # generation 2 fences generation 1
    old.close(wait=False)  # the old group ends (an error: its loop's cleanup)
    newest = lease.read_newest(tmp_path)
    assert (newest.generation, newest.released) == (2, False)
    with pytest.raises(Fatal, match="in use by job writer-a"):
        _volume_lease(tmp_path, B).acquire(lambda refusal: refusal)
    new.close()


# -- a killed holder --

HOLD = """
import sys, threading
from pathlib import Path
from brain_trainer.checkpoint.lease import VolumeLease
from brain_trainer.contract import LEASE_HOLDER_ENV
held = VolumeLease(Path(sys.argv[1]), float(sys.argv[2]), rank=0, env={LEASE_HOLDER_ENV: sys.argv[3]})
held.acquire(lambda refusal: refusal)
print("taken", flush=True)
threading.Event().wait()
"""


def test_the_lease_of_a_killed_run_is_taken_over_once_it_expired(tmp_path):
    with start([sys.executable, "-c", HOLD, tmp_path, "1.0", A], timeout=DEADLINE_S) as holder:
        assert next(line.strip() for line in holder.lines() if line.strip()) == "taken"
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    killed = lease.read_newest(tmp_path)
    taker = _volume_lease(tmp_path, B)
    _wait_for(lambda: taker._take() is None, "the killed holder's lease to expire")  # refused until then
    record = lease.read_newest(tmp_path)
    assert (record.generation, record.holder) == (killed.generation + 1, B)
    assert lease.generations(tmp_path) == [record.generation]  # the dead holder's file is gone
    assert json.loads(lease.lease_path(tmp_path, record.generation).read_text())["holder"] == B
