"""The training loop under tensor parallelism, on 4 gloo ranks: tp2 x dp2 trains like dp4 on the same global batch,
and checkpoints move between the layouts (tp2 x dp2 -> dp4, dp4 -> tp2 x dp2) with the same weights and the
sample-exact data position; `braintrain export` writes the full tensors of a tp checkpoint."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from brain_trainer.checkpoint.sample_log import SAMPLE_LOG_ENV
from brain_trainer.config import TrainerConfig
from brain_trainer.loop.train import train
from brain_trainer.model.export import export
from harness import run_ranks

WORLD, STEPS, SAVED = 4, 4, 2


def _job(tp: int, folder: Path) -> TrainerConfig:
    return TrainerConfig.from_dict({
        "model": {"preset": "minimal"},
        # global batch 8: micro-batch 2 x 4 dp ranks, or x 2 dp ranks x 2 accumulation under tp2
        "training": {"steps": STEPS, "seq_len": 16, "micro_batch_size": 2, "global_batch_size": 8,
                     "learning_rate": 2e-3, "warmup_steps": 1, "log_interval": 1},
        "distributed": {"strategy": "fsdp", "tensor_parallel": tp},
        "data": {"source": "synthetic", "num_samples": 40},
        "checkpoint": {"dir": str(folder / "checkpoints"), "interval_steps": SAVED, "async": False},
        "metrics": {"port": 0},
    })


def _train(rank, world_size, tp, folder):
    os.environ[SAMPLE_LOG_ENV] = str(Path(folder) / "samples.jsonl")
    return [(step, loss) for step, loss in train(_job(tp, Path(folder))).history]


def _samples(folder: Path) -> dict[int, list[int]]:
    """Samples read per step by all ranks together, sorted (dp4 and tp2 x dp2 deal one step's window of the
    stream differently: 4 micro-batches at once, or 2 micro-steps of 2)."""
    by_step: dict[int, list[int]] = {}
    for line in (folder / "samples.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_step.setdefault(record["step"], []).extend(record["samples"])
    return {step: sorted(samples) for step, samples in by_step.items()}


def _resumed(source: Path, folder: Path) -> Path:
    """A fresh run folder holding only `source`'s checkpoint of step SAVED."""
    name = f"step-{SAVED:08d}"
    shutil.copytree(source / "checkpoints" / name, folder / "checkpoints" / name)
    return folder


def _weights(folder: Path, out: Path) -> dict[str, torch.Tensor]:
    export(folder / "checkpoints", out)
    return load_file(str(out / "model.safetensors"))


def _close(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> bool:
    return [s for s, _ in a] == [s for s, _ in b] and all(abs(x - y) <= 1e-4 * abs(y) for (_, x), (_, y) in zip(a, b))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("tp")
    dp4, tp2 = base / "dp4", base / "tp2"
    return {
        "dp4": (dp4, run_ranks(_train, WORLD, 1, str(dp4))[0]),
        "tp2": (tp2, run_ranks(_train, WORLD, 2, str(tp2))[0]),
    }


def test_tp2_dp2_trains_like_dp4(runs):
    (dp4, reference), (tp2, losses) = runs["dp4"], runs["tp2"]
    assert len(reference) == STEPS and _close(losses, reference), (losses, reference)
    # each sample once per step (the tp ranks of a group read the same batch, and only the first logs it)
    samples = _samples(tp2)
    assert samples == _samples(dp4) and all(len(s) == 8 for s in samples.values())


@pytest.mark.parametrize("written, resumed", [("tp2", 1), ("dp4", 2)])
def test_checkpoint_resumes_under_the_other_layout(runs, tmp_path, written, resumed):
    dp4, reference = runs["dp4"]
    folder = _resumed(runs[written][0], tmp_path / "resumed")
    losses = run_ranks(_train, WORLD, resumed, str(folder))[0]
    assert _close(losses, reference[SAVED:]), (losses, reference[SAVED:])
    samples, expected = _samples(folder), _samples(dp4)
    assert sorted(samples) == list(range(SAVED + 1, STEPS + 1))
    assert all(samples[step] == expected[step] for step in samples)
    final, expected_final = _weights(folder, tmp_path / "out"), _weights(dp4, tmp_path / "reference")
    assert final.keys() == expected_final.keys()
    for name, tensor in final.items():
        torch.testing.assert_close(tensor, expected_final[name], rtol=1e-4, atol=1e-6, msg=name)


def test_export_of_a_tp_checkpoint_writes_full_tensors(runs, tmp_path):
    written = _weights(runs["tp2"][0], tmp_path / "tp2")
    reference = _weights(runs["dp4"][0], tmp_path / "dp4")
    assert {name: tuple(t.shape) for name, t in written.items()} == {name: tuple(t.shape) for name, t in reference.items()}
    for name, tensor in written.items():
        torch.testing.assert_close(tensor, reference[name], rtol=1e-4, atol=1e-6, msg=name)
