"""benchmarks/gpu_throughput.py on the CPU: its steady-state step time agrees with an independent timing of the same
model, its FLOPs are the counted ones, MFU is n/a without a known peak, and without CUDA the GPU run exits 2."""

import json
import os
import sys
import time
from pathlib import Path

import torch
from processes import run

from brain_trainer.config import TrainingConfig
from brain_trainer.config.model_flops import training_flops_per_token
from brain_trainer.config.presets import preset_config
from brain_trainer.loop.loss import loss_fn
from brain_trainer.model.brain_ai import BrainAI

ROOT = Path(__file__).resolve().parents[2]
BENCHMARK = ROOT / "benchmarks" / "gpu_throughput.py"
MICRO_BATCH, SEQ_LEN, WARMUP, STEPS = 4, 128, 3, 12


def independent_step_seconds() -> float:
    """The minimal preset trained by hand, as any script would: forward, backward, clip, AdamW; warm-up left out."""
    torch.manual_seed(0)
    model = BrainAI.from_preset("minimal")
    optimizer = torch.optim.AdamW(model.parameters(), lr=TrainingConfig().learning_rate)
    tokens = torch.randint(0, 256, (MICRO_BATCH, SEQ_LEN + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    for step in range(WARMUP + STEPS):
        if step == WARMUP:
            began = time.perf_counter()
        loss_fn(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return (time.perf_counter() - began) / STEPS


def test_cpu_step_time_agrees_with_an_independent_timing(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        str(ROOT / part) for part in ("trainer", "operator", "tests"))}
    done = run([sys.executable, BENCHMARK, "--device", "cpu", "--micro-batch", MICRO_BATCH, "--seq-len", SEQ_LEN,
                "--warmup", WARMUP, "--steps", STEPS, "--json", out], timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the benchmark ran
    try:
        independent = independent_step_seconds()
    finally:
        torch.set_num_threads(threads)
    (eager,) = report["modes"]  # compiled needs CUDA: skipped, and said so
    assert "compiled: skipped" in done.stderr
    assert eager["steps"] == STEPS
    # Consistency, not speed: the same work timed twice, on a machine others share.
    assert 0.5 <= eager["step_s"] / independent <= 2.0, (eager["step_s"], independent)
    assert 0.5 <= eager["plain_step_s"] / independent <= 2.0, (eager["plain_step_s"], independent)
    assert eager["tokens_per_s"] == MICRO_BATCH * SEQ_LEN / eager["step_s"]
    assert eager["trainer_over_plain"] == eager["plain_step_s"] / eager["step_s"]
    counted = training_flops_per_token(preset_config("minimal"), SEQ_LEN)
    assert report["flops_per_token_counted"] == report["flops_per_token_formula"] == counted
    assert eager["mfu"] is None and eager["peak_memory_bytes"] is None and report["peak_flops"] is None
    assert "MFU n/a: no known dense bf16 peak for 'cpu'" in done.stdout


def test_the_gpu_run_without_cuda_exits_2_with_one_line():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT / "trainer")}
    done = run([sys.executable, BENCHMARK], timeout=120, env=env)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "no CUDA device" in done.stderr
