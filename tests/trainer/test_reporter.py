"""observe.Reporter: the loop tells it what happened in plain numbers; it keeps the books and rank 0 publishes them.

The reporter's clock is replaced by one the test moves, so every figure is exact.
"""

from __future__ import annotations

import json

import pytest

from brain_trainer.config import TrainerConfig
from brain_trainer.contract import PROGRESS_FILE_ENV, Progress
from brain_trainer.observe import reporter as reporter_module
from brain_trainer.observe.goodput import CHECKPOINT, EVALUATION, INITIALIZATION, PRODUCTIVE
from brain_trainer.observe.goodput_log import LEDGER_FILE
from brain_trainer.observe.reporter import Reporter

STEPS, LOG_INTERVAL = 4, 2
TOKENS_PER_STEP = 64
STEP_S, SETUP_S, SAVE_S, EVAL_S, FINAL_SAVE_S = 3.0, 5.0, 2.0, 0.5, 1.5


class Clock:
    """Stands in for the `time` module inside observe/reporter.py."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(reporter_module, "time", fake)
    return fake


def config(tmp_path) -> TrainerConfig:
    return TrainerConfig.from_dict({
        "training": {"steps": STEPS, "log_interval": LOG_INTERVAL},
        "checkpoint": {"dir": str(tmp_path / "ckpt")},
        "metrics": {"port": 0},
    })


def run(reporter: Reporter, clock: Clock, compiling: bool = False):
    """STEPS steps of STEP_S each from step 0; step 2 includes a save the loop waited SAVE_S for; an evaluation of
    EVAL_S after the last step; then the final save."""
    clock.now += SETUP_S
    reporter.started(0, tokens_per_step=TOKENS_PER_STEP, flops_per_token=6e3, peak_flops=None, world_size=2,
                     info={"version": "test", "preset": "minimal", "strategy": "ddp", "world_size": "2"},
                     compiling=compiling)
    waited = 0.0
    for step in range(1, STEPS + 1):
        clock.now += STEP_S
        waited += SAVE_S if step == 2 else 0.0
        reporter.stepped(step, waited)
        if step == STEPS:
            clock.now += EVAL_S
            reporter.evaluated(step, loss=2.5, perplexity=12.18, tokens=512, seconds=EVAL_S)
        if step % LOG_INTERVAL == 0:
            reporter.logged(step, loss=10.0 - step, lr=1e-3, grad_norm=0.5, peak_memory=1 << 20,
                            last_checkpoint_step=2, answered=("now", 2) if step == STEPS else None,
                            checkpoint_interval=50)
    reporter.loop_ended(STEPS)
    clock.now += FINAL_SAVE_S
    return reporter.finished(last_checkpoint_step=STEPS, answered=("now", 2))


def test_every_rank_keeps_the_books_of_its_result(tmp_path, clock):
    reporter = Reporter(config(tmp_path), rank=1, started=clock.now)
    books = run(reporter, clock)
    reporter.close()
    assert (books.first_step, books.steps) == (0, STEPS)
    assert books.history == [(2, 8.0), (4, 6.0)]
    # Throughput windows between logging steps, training only: the benchmark's steady state is made of these.
    assert books.windows == [(2, 2, 2 * STEP_S), (4, 2, 2 * STEP_S)]
    assert books.eval_history == [(4, 2.5)] and books.eval_seconds == EVAL_S
    # The loop's time: first step to the last, evaluation included, the final save not.
    assert books.loop_seconds == STEPS * STEP_S + EVAL_S
    assert not (tmp_path / "ckpt" / LEDGER_FILE).exists()  # only rank 0 keeps the run's ledger


def test_rank_0_publishes_progress_and_keeps_the_ledger(tmp_path, clock, monkeypatch):
    progress_file = tmp_path / "progress.json"
    monkeypatch.setenv(PROGRESS_FILE_ENV, str(progress_file))
    reporter = Reporter(config(tmp_path), rank=0, started=clock.now)
    run(reporter, clock)
    reporter.close()
    final = Progress.from_json(progress_file.read_text())
    assert (final.step, final.total_steps, final.loss, final.eval_loss) == (STEPS, STEPS, 6.0, 2.5)
    assert (final.checkpoint_request, final.checkpoint_request_step) == ("now", 2)
    assert (final.last_checkpoint_step, final.checkpoint_interval_steps) == (STEPS, 50)
    # Throughput counts training only: the evaluation's time is left out.
    assert final.tokens_per_second == pytest.approx(LOG_INTERVAL * TOKENS_PER_STEP / (LOG_INTERVAL * STEP_S))
    assert final.mfu is None  # no peak: MFU unknown, not 0
    seconds = json.loads((tmp_path / "ckpt" / LEDGER_FILE).read_text())["seconds"]
    assert seconds[INITIALIZATION] == SETUP_S
    assert seconds[PRODUCTIVE] == STEPS * STEP_S - SAVE_S  # a save's wait inside a step is the checkpoint's
    assert seconds[CHECKPOINT] == SAVE_S + FINAL_SAVE_S
    assert seconds[EVALUATION] == EVAL_S
    assert final.goodput.productive_seconds == seconds[PRODUCTIVE]


def test_with_compiled_blocks_the_first_step_is_initialization_and_still_counts_as_reached(tmp_path, clock):
    # torch.compile compiles each block at its first call: the first step's time is mostly compiling.
    reporter = Reporter(config(tmp_path), rank=0, started=clock.now)
    run(reporter, clock, compiling=True)
    reporter.close()
    ledger = json.loads((tmp_path / "ckpt" / LEDGER_FILE).read_text())
    assert ledger["seconds"][INITIALIZATION] == SETUP_S + STEP_S
    assert ledger["seconds"][PRODUCTIVE] == (STEPS - 1) * STEP_S - SAVE_S  # only the first step moved
    assert ledger["high_water"] == STEPS, "a restart recomputes from the first step on, compiled or not"
