"""brain_trainer's loop against a plain DDP loop: same model, data and steps on 2 gloo ranks.

    .venv/bin/python benchmarks/trainer_overhead.py [--steps 200] [--repeats 4]

Prints, for whole runs (setup included; median over interleaved repeats after
one warm-up of each), tokens per wall second and per CPU second of rank 0,
each with its ratio to the plain loop (target: the lower of the two >= 0.98,
the median of 3 runs). On a shared machine
the CPU-second figure is the steadier one: other people's load changes wall
time, not the work a run does. "checkpoints on" adds the preemption votes, a
checkpoint manager's setup and the final save; its interval is 0, so no save
happens inside the loop. Then, for the loop alone (first step to last, as
`train` times it: setup and final save left out), tokens per wall second and
the ratio checkpoints on / off (target >= 0.98): the median over repeats of
the ratio within each repeat.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness import run_ranks  # noqa: E402  (N real gloo ranks)

from brain_trainer.config import TrainerConfig  # noqa: E402
from brain_trainer.data.loader import ByteFileDataset  # noqa: E402
from brain_trainer.loop.train import train  # noqa: E402
from brain_trainer.model.brain_ai import build_model  # noqa: E402

WORLD_SIZE = 2
MICRO_BATCH = 8
SEQ_LEN = 64


def job(steps: int, checkpoint_dir: str | None) -> TrainerConfig:
    return TrainerConfig.from_dict({
        "model": {"preset": "minimal"},
        "training": {"steps": steps, "micro_batch_size": MICRO_BATCH, "seq_len": SEQ_LEN, "log_interval": steps},
        "distributed": {"strategy": "ddp"},
        "data": {"source": "files", "path": str(Path(sysconfig.get_paths()["stdlib"]) / "*.py")},
        "checkpoint": {"enabled": checkpoint_dir is not None, "dir": checkpoint_dir or "unused", "interval_steps": 0},
        "metrics": {"port": 0},
    })


def plain_ddp(cfg: TrainerConfig, rank: int) -> float:
    """The loop everyone writes first: DDP, AdamW, clipping, a DistributedSampler. Returns the loop's seconds."""
    t = cfg.training
    torch.manual_seed(t.seed)
    model = DistributedDataParallel(build_model(cfg.model))
    optimizer = torch.optim.AdamW(model.parameters(), lr=t.learning_rate, betas=(0.9, 0.95), weight_decay=t.weight_decay)
    dataset = ByteFileDataset(cfg.data.path, t.seq_len)
    sampler = DistributedSampler(dataset, num_replicas=WORLD_SIZE, rank=rank, seed=t.seed, drop_last=True)
    batches = iter(DataLoader(dataset, batch_size=t.micro_batch_size, sampler=sampler, drop_last=True))
    start = time.perf_counter()
    for _ in range(t.steps):
        x, y = next(batches)
        loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    loss.item()
    return time.perf_counter() - start


def timed(run: Callable[[], float]) -> tuple[float, float, float]:
    """Wall and CPU seconds (this process, all threads) of one whole run, setup included, and its loop's seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    loop = run()
    return time.perf_counter() - wall, time.process_time() - cpu, loop


def _rank(rank: int, world_size: int, steps: int, repeats: int) -> dict[str, list[tuple[float, float, float]]]:
    with tempfile.TemporaryDirectory() as tmp:
        variants = {
            "plain DDP loop": lambda i: plain_ddp(job(steps, None), rank),
            "brain_trainer": lambda i: train(job(steps, None)).wall_seconds,
            "brain_trainer, checkpoints on": lambda i: train(job(steps, os.path.join(tmp, f"run{i}"))).wall_seconds,
        }
        names = list(variants)
        for name in names:  # warm-up: first-use imports and allocations are paid outside the timings
            variants[name](-1)
        results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
        for i in range(repeats):
            # interleaved, each repeat in a rotated order: drift in machine load hits every variant alike
            for name in names[i % len(names):] + names[: i % len(names)]:
                results[name].append(timed(lambda: variants[name](i)))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    results = run_ranks(_rank, WORLD_SIZE, args.steps, args.repeats, timeout=3600)[0]  # rank 0's timings
    tokens = args.steps * MICRO_BATCH * WORLD_SIZE * SEQ_LEN
    wall = {name: tokens / statistics.median(w for w, _, _ in runs) for name, runs in results.items()}
    cpu = {name: tokens / statistics.median(c for _, c, _ in runs) for name, runs in results.items()}
    loop = {name: tokens / statistics.median(lp for _, _, lp in runs) for name, runs in results.items()}
    print(f"minimal preset, {WORLD_SIZE} gloo ranks, micro-batch {MICRO_BATCH}, seq_len {SEQ_LEN}, "
          f"{args.steps} steps, median of {args.repeats}")
    print(f"  {'':32s} {'whole runs: tokens/s':>20s} {'ratio':>6s}   {'tokens/CPU-s':>12s} {'ratio':>6s}   "
          f"{'loop only: tokens/s':>19s}")
    for name in results:
        print(f"  {name:32s} {wall[name]:20.0f} {wall[name] / wall['plain DDP loop']:6.3f}   "
              f"{cpu[name]:12.0f} {cpu[name] / cpu['plain DDP loop']:6.3f}   {loop[name]:19.0f}")
    on, off = results["brain_trainer, checkpoints on"], results["brain_trainer"]
    pairs = [off_run[2] / on_run[2] for on_run, off_run in zip(on, off)]
    print(f"  loop only, checkpoints on / off: {statistics.median(pairs):.3f} (each repeat: "
          f"{', '.join(f'{p:.3f}' for p in pairs)}; target >= 0.98)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
