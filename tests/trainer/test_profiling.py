"""A profile of a window of steps (issue 36, point 2: spec.profiling): every rank's trace, loadable, with the
steps asked for marked, beside the checkpoints; nothing when the run is past the window or asks for none."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from brain_trainer.config import TrainerConfig
from brain_trainer.contract import PROGRESS_FILE_ENV
from brain_trainer.loop.train import train
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
