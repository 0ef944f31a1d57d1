"""Tokens/s per GPU and model FLOPs utilisation (MFU) of the 1b preset in bf16, through brain_trainer.

    .venv/bin/python benchmarks/gpu_throughput.py [--steps 30] [--micro-batch 4] [--seq-len 2048] [--compile]
    torchrun --nproc-per-node 8 benchmarks/gpu_throughput.py        # FSDP over every GPU of a node

Runs the real training loop (`brain_trainer.loop.train`) on synthetic data, drops
the warm-up steps, and prints tokens/s/GPU and MFU against the GPU's dense
bf16 peak (target >= 45%). Model FLOPs per token are the usual 6 x parameters
for the matrix multiplies plus 12 x layers x d_model x seq_len for attention
scores (forward and backward, no recompute counted). Needs CUDA; without it
the script says so and exits 2.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from brain_trainer.config import TrainerConfig
from brain_trainer.config.presets import param_count, preset_config
from brain_trainer.loop.train import train

# Dense bf16 tensor-core peak, TFLOP/s, by device-name fragment (vendor data sheets).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 70.0}


def peak_tflops(name: str) -> float | None:
    return next((tflops for key, tflops in PEAK_TFLOPS.items() if key in name), None)


def flops_per_token(preset: str, seq_len: int) -> float:
    cfg = preset_config(preset)
    attention_layers = cfg.reasoning_blocks + 1  # the workspace attends too
    return 6.0 * param_count(cfg) + 12.0 * attention_layers * cfg.d_model * seq_len


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="1b")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the measurement")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--peak-tflops", type=float, help="override the device's dense bf16 peak")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_throughput: no CUDA device here; run it on a GPU machine", file=sys.stderr)
        return 2
    world = int(os.environ.get("WORLD_SIZE", "1"))

    def config(steps: int) -> TrainerConfig:
        return TrainerConfig.from_dict({
            "model": {"preset": args.preset},
            "training": {"steps": steps, "micro_batch_size": args.micro_batch, "seq_len": args.seq_len,
                         "warmup_steps": 0, "log_interval": max(1, steps), "compile": args.compile},
            "distributed": {"strategy": "fsdp" if world > 1 else "single", "mixed_precision_policy": "bf16",
                            "fsdp_sharding": "full_shard"},
            "checkpoint": {"enabled": False},
            "metrics": {"port": 0},
        })

    # The same run twice, warm-up only then full: the difference is steady state.
    warm = train(config(args.warmup))
    full = train(config(args.warmup + args.steps))
    tokens = args.steps * args.micro_batch * args.seq_len * world
    seconds = full.wall_seconds - warm.wall_seconds
    per_gpu = tokens / seconds / world
    name = torch.cuda.get_device_name()
    peak = args.peak_tflops or peak_tflops(name)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"device: {name} x {world}; preset {args.preset}, bf16, micro-batch {args.micro_batch} x {args.seq_len}")
        print(f"tokens/s/GPU: {per_gpu:,.0f}")
        print(f"peak memory:  {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
        if peak is None:
            print("MFU: unknown peak for this device; pass --peak-tflops")
        else:
            mfu = per_gpu * flops_per_token(args.preset, args.seq_len) / (peak * 1e12)
            print(f"MFU: {mfu:.1%} of {peak:.0f} TFLOP/s (target >= 45%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
