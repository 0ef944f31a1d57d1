"""Steady-state step time, tokens/s, peak memory and MFU of the trainer, eager and compiled, beside a plain loop.

    python benchmarks/gpu_throughput.py                       # CUDA: the 1b preset, bf16, micro-batch 4 x 2048
    python benchmarks/gpu_throughput.py --device cpu          # small CPU defaults; MFU n/a
    python benchmarks/gpu_throughput.py --json results.json   # the figures, machine-readable, too

(PYTHONPATH=trainer:operator from the repository root.) Everything is measured
inside one process and, for the trainer, inside one run: `train()` logs every
`--warmup` steps, and each logging step reads the loss back from the device,
so the loop's own throughput windows (TrainResult.windows) begin and end
with the accelerator caught up. The first window (build, first-step and
compile costs) is dropped; the step time is the rest's seconds over their
steps. The plain loop then trains the same model (same batch, AdamW,
clipping, precision; compiled the same way, per block) with nothing around
it, timed the same way: CUDA synchronised at both edges of the measured
steps, warm-up dropped. trainer/plain is the ratio of their throughputs
(target >= 0.98).

FLOPs per token: counted by FlopCounterMode on one real forward and backward
pass (on the meta device, model/flop_count.py), beside the term-by-term
formula (config/model_flops.py) and the usual 6N; MFU is counted FLOPs x
tokens/s over the device's dense bf16 peak (observe/flops.py's table, or
--peak-tflops). docs/performance.md has the method and measured tables.
Without CUDA and without `--device cpu` it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Optional

DEFAULTS = {  # per device: what finishes in about a minute (CUDA, 1b) or well under one (CPU, minimal)
    "cuda": {"preset": "1b", "micro_batch": 4, "seq_len": 2048, "steps": 30, "warmup": 5, "precision": "bf16"},
    "cpu": {"preset": "minimal", "micro_batch": 4, "seq_len": 128, "steps": 20, "warmup": 5, "precision": "fp32"},
}
MODES = ("eager", "compiled")


@dataclass
class Mode:
    """One mode's figures; the plain loop's beside the trainer's."""

    mode: str
    steps: int  # measured steps (warm-up left out)
    step_s: float
    tokens_per_s: float
    peak_memory_bytes: Optional[int]  # accelerator memory; None on CPU
    mfu: Optional[float]  # None without a known peak
    plain_step_s: float
    trainer_over_plain: float  # throughput ratio: plain step time / trainer step time


@dataclass
class Report:
    device: str
    preset: str
    precision: str
    micro_batch: int
    seq_len: int
    flops_per_token_counted: int
    flops_per_token_formula: int
    flops_per_token_6n: int
    peak_flops: Optional[float]
    modes: list[Mode]


def parse(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", choices=tuple(DEFAULTS), default="cuda")
    parser.add_argument("--preset", help="model preset (default: 1b on CUDA, minimal on CPU)")
    parser.add_argument("--micro-batch", type=int, help="sequences per step (default: 4)")
    parser.add_argument("--seq-len", type=int, help="tokens per sequence (default: 2048 on CUDA, 128 on CPU)")
    parser.add_argument("--steps", type=int, help="measured steps, rounded up to whole windows (default: 30, CPU 20)")
    parser.add_argument("--warmup", type=int, help="steps left out, and the window size (default: 5)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), help="default: bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--modes", default=",".join(MODES), help="eager, compiled or both (compiled: CUDA only)")
    parser.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak, for an unlisted device")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    for key, value in DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.modes = [mode for mode in args.modes.split(",") if mode]
    if not set(args.modes) <= set(MODES):
        parser.error(f"--modes: eager, compiled or both, got {','.join(args.modes)}")
    if min(args.steps, args.warmup, args.micro_batch, args.seq_len) < 1:
        parser.error("--steps, --warmup, --micro-batch and --seq-len must be >= 1")
    args.steps = -(-args.steps // args.warmup) * args.warmup
    return args


def trainer_step_seconds(args: argparse.Namespace, compiled: bool) -> tuple[float, int]:
    """(seconds per step, steps measured) of `train()`, from its own windows after the first."""
    from brain_trainer.config import TrainerConfig
    from brain_trainer.loop.train import train

    cfg = TrainerConfig.from_dict({
        "model": {"preset": args.preset},
        "training": {"steps": args.warmup + args.steps, "micro_batch_size": args.micro_batch, "seq_len": args.seq_len,
                     "warmup_steps": 0, "log_interval": args.warmup, "compile": compiled},
        "distributed": {"strategy": "single", "mixed_precision_policy": args.precision},
        "checkpoint": {"enabled": False},
        "metrics": {"port": 0},
    })
    result = train(cfg)
    measured = [(steps, seconds) for step, steps, seconds in result.windows if step > args.warmup]
    steps = sum(steps for steps, _ in measured)
    return sum(seconds for _, seconds in measured) / steps, steps


def plain_step_seconds(args: argparse.Namespace, compiled: bool, device) -> float:
    """Seconds per step of a plain loop of the same model, batch, optimizer and precision, warm-up left out."""
    import torch

    from brain_trainer.config import ModelConfig, TrainingConfig
    from brain_trainer.data.loader import SyntheticDataset
    from brain_trainer.loop.loss import autocast_context, loss_fn
    from brain_trainer.loop.optimizer import ADAMW_BETAS, param_groups
    from brain_trainer.model.brain_ai import build_model
    from brain_trainer.parallel.blocks import apply_block_options

    training = TrainingConfig()  # the trainer's defaults: learning rate, weight decay, clipping
    torch.manual_seed(training.seed)
    with device:
        model = build_model(ModelConfig(preset=args.preset))
    if compiled:
        apply_block_options(model, (), "inductor")
    optimizer = torch.optim.AdamW(param_groups(model, training.weight_decay), lr=training.learning_rate,
                                  betas=ADAMW_BETAS, fused=True if device.type == "cuda" else None)
    dataset = SyntheticDataset(args.micro_batch * (args.warmup + args.steps), args.seq_len, training.seed)

    def batch(index: int):
        items = [dataset[index * args.micro_batch + i] for i in range(args.micro_batch)]
        return (torch.stack([x for x, _ in items]).to(device, non_blocking=True),
                torch.stack([y for _, y in items]).to(device, non_blocking=True))

    def step(index: int) -> None:
        x, y = batch(index)
        with autocast_context(args.precision, device):
            loss = loss_fn(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), training.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for index in range(args.warmup):
        step(index)
    sync()
    began = time.perf_counter()
    for index in range(args.warmup, args.warmup + args.steps):
        step(index)
    sync()
    return (time.perf_counter() - began) / args.steps


def measure(args: argparse.Namespace) -> Report:
    import torch

    from brain_trainer.config import ModelConfig
    from brain_trainer.config.model_flops import six_n_flops_per_token, training_flops_per_token
    from brain_trainer.config.presets import param_count, preset_config
    from brain_trainer.loop.loss import loss_fn
    from brain_trainer.model.flop_count import counted_flops_per_token
    from brain_trainer.observe.flops import mfu, peak_flops

    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if on_cuda else "cpu"
    peak = peak_flops(name if on_cuda else None, None if args.peak_tflops is None else args.peak_tflops * 1e12)
    counted = counted_flops_per_token(ModelConfig(preset=args.preset), args.seq_len, loss_fn)
    model = preset_config(args.preset)
    tokens_per_step = args.micro_batch * args.seq_len
    modes = []
    for mode in args.modes:
        compiled = mode == "compiled"
        if compiled and not on_cuda:
            print("compiled: skipped (the trainer compiles on CUDA only)", file=sys.stderr)
            continue
        if on_cuda:
            torch.cuda.reset_peak_memory_stats(device)
        step_s, steps = trainer_step_seconds(args, compiled)
        memory = torch.cuda.max_memory_allocated(device) if on_cuda else None
        plain_s = plain_step_seconds(args, compiled, device)
        tokens_per_s = tokens_per_step / step_s
        modes.append(Mode(mode=mode, steps=steps, step_s=step_s, tokens_per_s=tokens_per_s, peak_memory_bytes=memory,
                          mfu=mfu(tokens_per_s, counted, peak, 1), plain_step_s=plain_s,
                          trainer_over_plain=plain_s / step_s))
    return Report(device=name, preset=args.preset, precision=args.precision, micro_batch=args.micro_batch,
                  seq_len=args.seq_len, flops_per_token_counted=counted,
                  flops_per_token_formula=training_flops_per_token(model, args.seq_len),
                  flops_per_token_6n=six_n_flops_per_token(param_count(model)), peak_flops=peak, modes=modes)


def table(report: Report) -> list[str]:
    counted, formula = report.flops_per_token_counted, report.flops_per_token_formula
    peak = "n/a" if report.peak_flops is None else f"{report.peak_flops / 1e12:.0f} TFLOP/s dense bf16"
    lines = [
        f"device: {report.device}; preset {report.preset}, {report.precision}, micro-batch {report.micro_batch} x "
        f"{report.seq_len}; peak {peak}",
        f"FLOPs/token: {counted:.4g} counted (FlopCounterMode), {formula:.4g} formula "
        f"({(formula - counted) / counted:+.2%}), {report.flops_per_token_6n:.4g} 6N",
        "",
        f"{'mode':<10}{'steps':>6}{'step ms':>10}{'tokens/s':>12}{'peak GiB':>10}{'MFU':>8}{'plain ms':>10}"
        f"{'trainer/plain':>15}",
    ]
    for m in report.modes:
        memory = "n/a" if m.peak_memory_bytes is None else f"{m.peak_memory_bytes / 2**30:.1f}"
        used = "n/a" if m.mfu is None else f"{m.mfu:.1%}"
        lines.append(f"{m.mode:<10}{m.steps:>6}{m.step_s * 1e3:>10.1f}{m.tokens_per_s:>12,.0f}{memory:>10}{used:>8}"
                     f"{m.plain_step_s * 1e3:>10.1f}{m.trainer_over_plain:>15.3f}")
    if report.peak_flops is None:
        lines.append(f"MFU n/a: no known dense bf16 peak for {report.device!r} (pass --peak-tflops)")
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    args = parse(argv)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch starts: the trainer takes a GPU whenever it sees one
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_throughput: no CUDA device here; run it on a GPU machine, or pass --device cpu", file=sys.stderr)
        return 2
    report = measure(args)
    print("\n".join(table(report)))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(asdict(report), out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
