"""A profile of a window of steps (issue 36, point 2: spec.profiling, and on demand through the profile request
file): every rank's trace, loadable, with the steps asked for marked, beside the checkpoints; nothing when the run
is past the window or asks for none."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from brain_trainer.config import CheckpointConfig, TrainerConfig
from brain_trainer.contract import PROGRESS_FILE_ENV, profile_request_steps
from brain_trainer.loop.train import train
from brain_trainer.observe.reporter import Reporter
from brain_trainer.resilience.preemption import Preemption
from brain_trainer.observe.profiling import PROFILES, profile_folder
from brain_trainer.schema import ConfigError
from harness import run_ranks
from small_runs import small_run

START, STEPS = 3, 2


def job(root: Path, steps: int, /, **profiling: Any) -> TrainerConfig:
    return small_run(root, steps, strategy="ddp", profiling=profiling)


def _train(rank, world_size, cfg, progress=None):
    if progress is not None:
        os.environ[PROGRESS_FILE_ENV] = progress
    return train(cfg).step


def marked_steps(path: Path) -> set[int]:
    """The optimizer steps the trace marks (the profiler's ProfilerStep#<n> spans)."""
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    return {int(m[1]) for e in trace["traceEvents"] if (m := re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", "")))}


def test_every_rank_writes_a_trace_of_the_steps_asked_for(tmp_path):
    progress = tmp_path / "progress.json"
    cfg = job(tmp_path, 6, start_step=START, steps=STEPS, record_shapes=True)
    assert run_ranks(_train, 2, cfg, str(progress)) == [6, 6]
    folder = profile_folder(tmp_path, START)
    assert json.loads(progress.read_text())["profile"] == str(folder), "announced in the progress document (status)"
    assert sorted(p.name for p in folder.iterdir()) == ["rank-0.json.gz", "rank-1.json.gz"]
    for rank in (0, 1):
        assert marked_steps(folder / f"rank-{rank}.json.gz") == {START, START + 1}


ASKED_AT, ASKED = 2, 2  # rank 0 asks after step 2's log line; the vote after step 3 agrees: steps 4 and 5


def _train_asking(rank, world_size, cfg, request, progress):
    """Rank 0 asks mid-run as `braintrain profile` does, by a new content of the request file (after its log line
    of step ASKED_AT, so the ask lands at a known step without waiting on a clock)."""
    os.environ[PROGRESS_FILE_ENV] = progress
    if rank == 0:
        logged = Reporter.logged

        def asking(self, step, *args, **kwargs):
            logged(self, step, *args, **kwargs)
            if step == ASKED_AT:
                Path(request).write_text(f"{ASKED} 2026-11-29T04:00:00Z\n")

        Reporter.logged = asking  # this rank's process only
    return train(cfg, profile_request=Path(request)).step


def test_a_profile_requested_mid_run_traces_the_steps_asked_for_on_every_rank(tmp_path):
    progress, request = tmp_path / "progress.json", tmp_path / "profile-request"
    cfg = small_run(tmp_path, 7, strategy="ddp", checkpoint={"preemption_vote_seconds": 0})  # a vote every step
    assert run_ranks(_train_asking, 2, cfg, str(request), str(progress)) == [7, 7]
    start = ASKED_AT + 2
    folder = profile_folder(tmp_path, start)
    assert [p.name for p in (tmp_path / PROFILES).iterdir()] == [folder.name]
    assert sorted(p.name for p in folder.iterdir()) == ["rank-0.json.gz", "rank-1.json.gz"]
    for rank in (0, 1):
        assert marked_steps(folder / f"rank-{rank}.json.gz") == set(range(start, start + ASKED))
    assert json.loads(progress.read_text())["profile"] == str(folder), "announced in the progress document (status)"


def test_rank_0s_vote_carries_a_new_profile_request_once_and_ignores_a_malformed_one(tmp_path, caplog):
    request = tmp_path / "profile-request"
    request.write_text("4 before this start\n")
    preemption = Preemption(CheckpointConfig(dir=str(tmp_path)), rank=0, profile_file=request)
    assert preemption.vote(1).profile_steps == 0, "a request from before the start is not repeated"
    request.write_text("3 now\n")
    assert [preemption.vote(step).profile_steps for step in (2, 3)] == [3, 0]
    request.write_text("three\n")
    assert preemption.vote(4).profile_steps == 0
    assert "profile request ignored: a profile request is '<steps> [anything]'" in caplog.text
    preemption.close()
    other = Preemption(CheckpointConfig(dir=str(tmp_path)), rank=1, profile_file=request)
    other.close()
    assert other.profiles.path is None, "only rank 0 reads the request"


@pytest.mark.parametrize("text", ["", "0", "-2 x", "two"])
def test_a_malformed_profile_request_is_named(text):
    with pytest.raises(ValueError, match=repr(text)):
        profile_request_steps(text)


def test_a_run_past_the_window_or_without_one_builds_no_profiler(tmp_path):
    assert run_ranks(_train, 2, job(tmp_path, 2)) == [2, 2]
    assert not (tmp_path / PROFILES).exists()
    assert run_ranks(_train, 2, job(tmp_path, 3, start_step=1)) == [3, 3]  # resumes at step 2
    assert not (tmp_path / PROFILES).exists()


def test_an_unknown_activity_is_named():
    with pytest.raises(ConfigError, match=r"profiling.activities\[1\]: must be one of cpu, cuda, got 'gpu'"):
        TrainerConfig.from_dict({"profiling": {"activities": ["cpu", "gpu"]}})


def test_a_manifests_profiling_reaches_trainer_yaml():
    from brain_operator.spec.derive import trainer_config
    from brain_operator.spec.parse import parse_job

    job_ = parse_job({"apiVersion": "brain.ai/v1alpha1", "kind": "BrainTrainingJob", "metadata": {"name": "llama"},
                      "spec": {"image": "trainer:1", "profiling": {"startStep": 100, "steps": 2, "recordShapes": True}}})
    profiling = TrainerConfig.from_dict(trainer_config(job_).to_dict()).profiling
    assert (profiling.start_step, profiling.steps, profiling.record_shapes, profiling.memory) == (100, 2, True, False)
