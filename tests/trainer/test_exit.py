"""A clean finish exits 0, every time: `python -m brain_trainer` leaves with os._exit once its final checkpoint is
committed, never through the interpreter's teardown, where libtorch now and then aborts (exit 134)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml
from processes import run, torchrun

from brain_trainer.checkpoint import store

STEPS = 3
SINGLE_RUNS = 5
TORCHRUN_RUNS = 3


def trainer_yaml(folder: Path) -> Path:
    config = {
        "model": {"preset": "minimal"},
        "training": {"steps": STEPS, "micro_batch_size": 2, "seq_len": 16, "log_interval": STEPS},
        "data": {"source": "synthetic", "num_samples": 64},
        "checkpoint": {"dir": str(folder / "ckpt")},
        "metrics": {"port": 0},
    }
    path = folder / "trainer.yaml"
    folder.mkdir()
    path.write_text(yaml.safe_dump(config))
    return path


def finishes(argv: list[str], folder: Path) -> None:
    """The run exits 0 with its final checkpoint committed, and says so on its last log line (flushed before exit)."""
    done = run(argv, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    final = folder / "ckpt" / store.step_dir_name(STEPS)
    assert store.latest_checkpoint(folder / "ckpt") == final and store.read_manifest(final)["step"] == STEPS
    assert f"checkpoint {final} committed" in done.stdout


def test_one_process_exits_0_after_its_final_commit_every_time(tmp_path):
    for i in range(SINGLE_RUNS):
        folder = tmp_path / f"run{i}"
        finishes([sys.executable, "-m", "brain_trainer", "--config", str(trainer_yaml(folder))], folder)


def test_two_ranks_under_torchrun_exit_0_after_their_final_commit_every_time(tmp_path):
    for i in range(TORCHRUN_RUNS):
        folder = tmp_path / f"run{i}"
        finishes(torchrun("-m", "brain_trainer", "--config", trainer_yaml(folder)), folder)
