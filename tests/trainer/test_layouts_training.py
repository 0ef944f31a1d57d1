"""The training loop under tensor and pipeline parallelism, on 4 gloo ranks: tp2 x dp2, pp2 x dp2 and tp2 x pp2 train
like dp4 on the same global batch (each sample read once per step); checkpoints move between the layouts
(tp2 x dp2 -> dp4, dp4 -> tp2 x dp2, pp2 x dp2 -> dp4, dp4 -> tp2 x pp2) with the same weights and the
sample-exact data position; an interrupted pp2 x dp2 run resumes bitwise; `braintrain export` writes the full
tensors of tp and pp checkpoints.

Each spawn runs several jobs one after another in the same 4 processes (the process group is the harness's)."""

from __future__ import annotations

import json
import logging
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
from harness import LogLines, run_ranks

WORLD, STEPS, SAVED = 4, 4, 2
LAYOUTS = {"dp4": {}, "tp2": {"tensor_parallel": 2}, "pp2": {"pipeline_parallel": 2},
           "tp2 x pp2": {"pipeline_parallel": 2, "tensor_parallel": 2}}


def _job(layout: str, folder: Path) -> TrainerConfig:
    return TrainerConfig.from_dict({
        "model": {"preset": "minimal"},
        # global batch 8: micro-batch 2 x 4 dp ranks; x 2 dp ranks x 2 micro-batches (tp2, pp2); x 4 (tp2 x pp2)
        "training": {"steps": STEPS, "seq_len": 16, "micro_batch_size": 2, "global_batch_size": 8,
                     "learning_rate": 2e-3, "warmup_steps": 1, "log_interval": 1, "grad_clip": 1.0},
        "distributed": {"strategy": "fsdp", **LAYOUTS[layout]},
        "data": {"source": "synthetic", "num_samples": 40},
        # tp and pp save in the background (the default), dp4 in the foreground: a resume reads either
        "checkpoint": {"dir": str(folder / "checkpoints"), "interval_steps": SAVED, "async": layout != "dp4"},
        "metrics": {"port": 0},
    })


def _train(rank, world_size, jobs):
    """Each (layout, folder) job's logged (step, loss) history; rank 0 adds its log lines."""
    results = []
    for layout, folder in jobs:
        os.environ[SAMPLE_LOG_ENV] = str(Path(folder) / "samples.jsonl")
        lines, root = LogLines(), logging.getLogger()
        root.addHandler(lines)
        root.setLevel(logging.INFO)
        try:
            history = [(step, loss) for step, loss in train(_job(layout, Path(folder))).history]
        finally:
            root.removeHandler(lines)
        results.append((history, lines.messages))
    return results


def _samples(folder: Path) -> dict[int, list[int]]:
    """Samples read per step by all ranks together, sorted."""
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
    base = tmp_path_factory.mktemp("layouts")
    folders = {layout: base / layout.replace(" ", "") for layout in LAYOUTS}
    results = run_ranks(_train, WORLD, [(layout, str(folder)) for layout, folder in folders.items()], timeout=600)
    return {layout: (folders[layout], *results[0][i]) for i, layout in enumerate(LAYOUTS)}


@pytest.fixture(scope="module")
def resumed(runs, tmp_path_factory):
    """Each step-SAVED checkpoint resumed under another layout, and pp2 x dp2's by itself (interrupted: the same run
    again)."""
    base = tmp_path_factory.mktemp("resumed")
    cases = {"tp2 -> dp4": ("tp2", "dp4"), "dp4 -> tp2": ("dp4", "tp2"), "pp2 -> dp4": ("pp2", "dp4"),
             "pp2 -> pp2": ("pp2", "pp2"), "dp4 -> tp2 x pp2": ("dp4", "tp2 x pp2")}
    folders = {name: _resumed(runs[written][0], base / name.replace(" ", "")) for name, (written, _) in cases.items()}
    results = run_ranks(_train, WORLD, [(cases[name][1], str(folder)) for name, folder in folders.items()], timeout=600)
    return {name: (folders[name], results[0][i][0]) for i, name in enumerate(cases)}


@pytest.mark.parametrize("layout", ["tp2", "pp2", "tp2 x pp2"])
def test_every_layout_trains_like_dp4(runs, layout):
    (dp4, reference, _), (folder, losses, lines) = runs["dp4"], runs[layout]
    assert len(reference) == STEPS and _close(losses, reference), (losses, reference)
    # each sample once per step (every stage and tp rank of a pipeline reads the same batch, one logs it)
    samples = _samples(folder)
    assert samples == _samples(dp4) and all(len(s) == 8 for s in samples.values())
    tp, pp = LAYOUTS[layout].get("tensor_parallel", 1), LAYOUTS[layout].get("pipeline_parallel", 1)
    assert any(f"(tensor parallel {tp}, pipeline parallel {pp})" in line for line in lines)
    assert any(line.startswith("model FLOPs per token") for line in lines)
    if pp == 1:
        return
    # rank 0 (the first stage) says the layout and its stages, as well as what every layout says
    (said,) = [line for line in lines if line.startswith("rank 0: pipeline parallel 2")]
    assert "schedule 1f1b, 1 stage(s) per rank; this rank runs stage 0: encoders, snn_core.blocks.0" in said


@pytest.mark.parametrize("name", ["tp2 -> dp4", "dp4 -> tp2", "pp2 -> dp4", "dp4 -> tp2 x pp2"])
def test_checkpoint_resumes_under_another_layout(runs, resumed, tmp_path, name):
    dp4, reference, _ = runs["dp4"]
    folder, losses = resumed[name]
    assert _close(losses, reference[SAVED:]), (losses, reference[SAVED:])
    samples, expected = _samples(folder), _samples(dp4)
    assert sorted(samples) == list(range(SAVED + 1, STEPS + 1))
    assert all(samples[step] == expected[step] for step in samples)
    final, expected_final = _weights(folder, tmp_path / "out"), _weights(dp4, tmp_path / "reference")
    assert final.keys() == expected_final.keys()
    for tensor_name, tensor in final.items():
        torch.testing.assert_close(tensor, expected_final[tensor_name], rtol=1e-4, atol=1e-6, msg=tensor_name)


def test_an_interrupted_pipeline_run_resumes_bitwise(runs, resumed, tmp_path):
    pp2, uninterrupted, _ = runs["pp2"]
    folder, losses = resumed["pp2 -> pp2"]
    assert losses == uninterrupted[SAVED:]
    assert _samples(folder) == {step: s for step, s in _samples(pp2).items() if step > SAVED}
    final, expected = _weights(folder, tmp_path / "out"), _weights(pp2, tmp_path / "reference")
    assert final.keys() == expected.keys() and all(torch.equal(final[n], expected[n]) for n in final)


@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_export_of_a_split_checkpoint_writes_full_tensors(runs, tmp_path, layout):
    written = _weights(runs[layout][0], tmp_path / layout)
    reference = _weights(runs["dp4"][0], tmp_path / "dp4")
    assert {name: tuple(t.shape) for name, t in written.items()} == {name: tuple(t.shape) for name, t in reference.items()}
    for name, tensor in written.items():
        torch.testing.assert_close(tensor, reference[name], rtol=1e-4, atol=1e-6, msg=name)
