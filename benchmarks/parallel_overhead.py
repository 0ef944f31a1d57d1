"""Step time of each parallel layout against DDP on the same ranks: ddp, fsdp, tpN x dpM and ppN x dpM.

    PYTHONPATH=trainer:operator .venv/bin/python benchmarks/parallel_overhead.py \
        [--world-sizes 2 4] [--tensor-parallel 2] [--pipeline-parallel 2] [--micro-batches 4] \
        [--steps 20] [--warmup 3] [--micro-batch 4] [--seq-len 64]

Real gloo ranks on this machine's CPUs (one spawned process per rank, one
thread each), the minimal preset, AdamW. For each world size, each layout
trains the same model for `--warmup` untimed steps, then `--steps` timed
ones; a step is forward, backward and the optimizer step, and its time is the
slowest rank's mean (a step ends when every rank has ended it). Every
data-parallel rank reads a micro batch of `--micro-batch` sequences of
`--seq-len` tokens; the tp ranks of one group read the same one, so a tpN
layout trains N times fewer tokens per step than DDP on the same ranks. A
ppN x dpM layout (1f1b, FSDP2 per stage) runs `--micro-batches` micro
batches per data-parallel rank and step through its schedule. Two
ratios against DDP on the same world size, then: step time (above 1: slower)
and tokens per second (below 1: less throughput).

On a couple of shared CPU cores tensor parallelism costs more than it saves:
its all-reduces per block are extra work on the same cores and the model is
far too small for split matmuls to pay. The point is the measurement; on a
GPU node (NVLink) the same script gives the figure docs/parallelism.md wants.
The layouts run one after another in each rank, so other load on the machine
moves the ratios: compare runs of the whole script, not single lines.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness import run_ranks  # noqa: E402  (N real gloo ranks)

from brain_trainer.config import DistributedConfig  # noqa: E402
from brain_trainer.loop.loss import loss_fn  # noqa: E402
from brain_trainer.model.brain_ai import BrainAI  # noqa: E402
from brain_trainer.parallel.ddp import DDPWrapper  # noqa: E402
from brain_trainer.parallel.fsdp import FSDPWrapper  # noqa: E402
from brain_trainer.plan.layout import Layout  # noqa: E402
from brain_trainer.parallel.pipeline import PipelineWrapper  # noqa: E402
from brain_trainer.parallel.step import StepSettings  # noqa: E402

PRESET = "minimal"
BASELINE = "ddp"


@dataclass(frozen=True)
class Shape:
    steps: int
    warmup: int
    micro_batch: int
    seq_len: int
    micro_batches: int  # per data-parallel rank and step, under pipeline parallelism


@dataclass(frozen=True)
class Parallel:
    """One layout: its strategy and degrees."""

    strategy: str
    tp: int = 1
    pp: int = 1

    def micro_batches(self, shape: Shape) -> int:
        """Micro batches each data-parallel rank reads per step: the pipeline's, else one."""
        return shape.micro_batches if self.pp > 1 else 1


def layouts(world_size: int, tensor_parallel: list[int], pipeline_parallel: list[int]) -> list[tuple[str, Parallel]]:
    """(name, layout) for one world size: the DDP baseline, FSDP, then each tp, then each pp, that divides the world."""
    chosen = [(BASELINE, Parallel("ddp")), ("fsdp", Parallel("fsdp"))]
    chosen += [(f"tp{tp} x dp{world_size // tp}", Parallel("fsdp", tp=tp)) for tp in tensor_parallel
               if 1 < tp <= world_size and world_size % tp == 0]
    chosen += [(f"pp{pp} x dp{world_size // pp}", Parallel("fsdp", pp=pp)) for pp in pipeline_parallel
               if 1 < pp <= world_size and world_size % pp == 0]
    return chosen


def step_seconds(parallel: Parallel, shape: Shape, rank: int, world_size: int) -> float:
    """This rank's mean seconds per timed step under one layout."""
    torch.manual_seed(0)  # the same initial model on every rank
    model = BrainAI.from_preset(PRESET)
    config = DistributedConfig(strategy=parallel.strategy, tensor_parallel=parallel.tp,
                               pipeline_parallel=parallel.pp).resolved(PRESET)
    micro_batches = parallel.micro_batches(shape)
    if parallel.pp > 1:
        wrapper = PipelineWrapper(model, config, steps=StepSettings(seq_len=shape.seq_len, micro_batches=micro_batches,
                                                                    loss_fn=loss_fn))
    else:
        wrapper = (DDPWrapper if parallel.strategy == "ddp" else FSDPWrapper)(model, config)
    model = wrapper.setup(rank, world_size)
    # the per-parameter loop for every layout: tp puts parameters on two meshes, which foreach cannot mix
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    layout = Layout(world_size=world_size, tp=parallel.tp, pp=parallel.pp)
    generator = torch.Generator().manual_seed(layout.dp_rank(rank))
    tokens = torch.randint(0, 256, (shape.micro_batch * micro_batches, shape.seq_len + 1), generator=generator)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    for step in range(shape.warmup + shape.steps):
        if step == shape.warmup:
            dist.barrier()  # every rank starts the timed steps together
            began = time.perf_counter()
        if parallel.pp > 1:
            wrapper.step(inputs, targets)  # forward and backward of every micro batch, through the schedule
        else:
            loss_fn(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    elapsed = time.perf_counter() - began
    wrapper.cleanup()
    return elapsed / shape.steps


def _rank(rank: int, world_size: int, tensor_parallel: list[int], pipeline_parallel: list[int],
          shape: Shape) -> dict[str, float]:
    seconds = {}
    for name, parallel in layouts(world_size, tensor_parallel, pipeline_parallel):
        mine = torch.tensor([step_seconds(parallel, shape, rank, world_size)])
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # a step is as slow as its slowest rank
        seconds[name] = mine.item()
    return seconds


def report(world_size: int, seconds: dict[str, float], tensor_parallel: list[int], pipeline_parallel: list[int],
           shape: Shape) -> list[str]:
    """One line per layout: step time, tokens per second, and both against DDP on the same ranks."""
    lines = [f"world size {world_size}:"]
    tokens_per_s = {}
    chosen = layouts(world_size, tensor_parallel, pipeline_parallel)
    for name, parallel in chosen:
        data_parallel = world_size // (parallel.tp * parallel.pp)
        tokens = shape.micro_batch * parallel.micro_batches(shape) * shape.seq_len * data_parallel
        tokens_per_s[name] = tokens / seconds[name]
    for name, _ in chosen:
        lines.append(
            f"  {name:<12} step {seconds[name] * 1e3:9.1f} ms  {tokens_per_s[name]:10.0f} tokens/s  "
            f"step time x{seconds[name] / seconds[BASELINE]:.2f}  tokens/s x{tokens_per_s[name] / tokens_per_s[BASELINE]:.2f}"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--tensor-parallel", type=int, nargs="+", default=[2])
    parser.add_argument("--pipeline-parallel", type=int, nargs="+", default=[2])
    parser.add_argument("--micro-batches", type=int, default=4, help="per data-parallel rank and step, under pp")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args(argv)
    if (args.steps < 1 or args.warmup < 0 or args.micro_batch < 1 or args.seq_len < 1 or min(args.world_sizes) < 1
            or args.micro_batches < max(args.pipeline_parallel)):
        parser.error("--steps, --micro-batch, --seq-len and --world-sizes must be >= 1, --warmup >= 0, "
                     "--micro-batches >= each --pipeline-parallel")
    shape = Shape(args.steps, args.warmup, args.micro_batch, args.seq_len, args.micro_batches)
    print(f"parallel overhead: {PRESET} preset on CPU (gloo, one thread per rank), micro batch {shape.micro_batch} x "
          f"{shape.seq_len} tokens per data-parallel rank ({shape.micro_batches} of them per step under pp), "
          f"{shape.steps} timed steps after {shape.warmup} warm-up; "
          f"ratios against {BASELINE} on the same ranks")
    for world_size in args.world_sizes:
        seconds = run_ranks(_rank, world_size, args.tensor_parallel, args.pipeline_parallel, shape, timeout=1800.0)[0]
        print("\n".join(report(world_size, seconds, args.tensor_parallel, args.pipeline_parallel, shape)), flush=True)


if __name__ == "__main__":
    main()
