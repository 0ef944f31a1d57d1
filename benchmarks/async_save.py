"""How long asynchronous checkpoint saves stall training, and how fast saves reach the disk against a raw write.

    python benchmarks/async_save.py --dir /fast/disk/folder          # CUDA: the 1b preset, 3 async saves + 1 final
    python benchmarks/async_save.py --device cpu --preset minimal    # a small run of the same

(PYTHONPATH=trainer:operator from the repository root; benchmarks/gpu_check.sh
runs it.) One process, the trainer's own CheckpointManager and TrainState: the
preset's model and AdamW state (12 bytes per parameter: 12.3 GB for 1b).
Each asynchronous save is followed by one training step, as in the loop (its
optimizer step waits for the copy to CPU memory); its stall is what the
manager reports as blocking the loop (`last_stall_s`), and its save time runs
from the call to the committed checkpoint. Then the final save, blocking, as
at the end of a run. Last, a raw write: as many bytes as one checkpoint,
sequential 8 MiB writes to one file in the same folder and one fsync, the
disk's own limit; each save's GB/s is compared with it (issue 27's target:
>= 0.7). Checkpoints go to a fresh folder under --dir, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

CHUNK = 8 << 20  # bytes per write of the raw baseline
DEFAULTS = {"cuda": {"preset": "1b", "seq_len": 512}, "cpu": {"preset": "minimal", "seq_len": 64}}


@dataclass
class Save:
    kind: str  # async | final
    step: int
    bytes: int
    stall_s: float  # how long the training loop was blocked
    save_s: float  # from the call to the committed checkpoint
    gb_per_s: float
    over_raw: float  # this save's GB/s over the raw write's


@dataclass
class Report:
    device: str
    preset: str
    raw_gb_per_s: float
    saves: list[Save]


def raw_write_seconds(folder: Path, size: int) -> float:
    """Seconds to write `size` bytes sequentially to a new file in `folder` and fsync it."""
    block = os.urandom(CHUNK)  # incompressible, like weights
    path = folder / "raw-write.bin"
    began = time.perf_counter()
    with open(path, "wb", buffering=0) as out:
        left = size
        while left > 0:
            left -= out.write(block[: min(CHUNK, left)])
        os.fsync(out.fileno())
    seconds = time.perf_counter() - began
    path.unlink()
    return seconds


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def measure(args: argparse.Namespace, root: Path) -> Report:
    import torch
    import torch.distributed as dist
    from torch.optim.lr_scheduler import LambdaLR

    from brain_trainer.checkpoint import CheckpointManager, TrainState
    from brain_trainer.config import CheckpointConfig, ModelConfig
    from brain_trainer.loop.loss import loss_fn
    from brain_trainer.loop.optimizer import ADAMW_BETAS, param_groups
    from brain_trainer.model.brain_ai import build_model
    from brain_trainer.plan import checkpoint_bytes

    device = torch.device(args.device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        with device:
            model = build_model(ModelConfig(preset=args.preset))
        optimizer = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-4, betas=ADAMW_BETAS,
                                      fused=True if device.type == "cuda" else None)
        state = TrainState(model=model, optimizer=optimizer, scheduler=LambdaLR(optimizer, lambda step: 1.0))
        tokens = torch.randint(0, 256, (1, args.seq_len + 1), device=device)
        sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

        def train_step() -> None:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()

        train_step()  # AdamW's moments exist: the checkpoint has its full size
        parameters = sum(p.numel() for p in model.parameters())
        ckpt = CheckpointManager(CheckpointConfig(dir=str(root), interval_steps=1, keep_last=1, async_save=True),
                                 rank=0, world_size=1, config_hash="async-save-benchmark",
                                 checkpoint_bytes=checkpoint_bytes(parameters))
        timed: list[tuple[str, int, int, float, float]] = []  # (kind, step, bytes, stall, save seconds)

        def committed(kind: str, began: float, stall: Optional[float]) -> None:
            seconds = time.perf_counter() - began
            if ckpt.last_committed is None or ckpt.last_committed[0] != state.step:
                raise RuntimeError(f"the {kind} save of step {state.step} was not committed")
            size = folder_bytes(ckpt.last_committed[1])
            timed.append((kind, state.step, size, seconds if stall is None else stall, seconds))

        for step in range(1, args.saves + 1):
            state.step = step
            began = time.perf_counter()
            ckpt.after_step(state, save=True)  # at every step: an asynchronous save
            train_step()
            stall = ckpt.last_stall_s
            ckpt.wait()
            committed("async", began, stall)
        state.step += 1
        began = time.perf_counter()
        ckpt.finish(state)  # the final save, blocking: the loop waits for all of it
        committed("final", began, None)
    finally:
        dist.destroy_process_group()
    largest = max(size for _, _, size, _, _ in timed)
    raw_gb_per_s = largest / raw_write_seconds(root, largest) / 1e9
    saves = [Save(kind=kind, step=step, bytes=size, stall_s=stall, save_s=seconds, gb_per_s=size / seconds / 1e9,
                  over_raw=size / seconds / 1e9 / raw_gb_per_s) for kind, step, size, stall, seconds in timed]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return Report(device=name, preset=args.preset, raw_gb_per_s=raw_gb_per_s, saves=saves)


def table(report: Report) -> list[str]:
    lines = [f"device: {report.device}; preset {report.preset}; raw sequential write + fsync: "
             f"{report.raw_gb_per_s:.2f} GB/s", f"{'save':<8}{'step':>6}{'GB':>8}{'stall s':>10}{'save s':>9}"
             f"{'GB/s':>7}{'save/raw':>10}{'stall/save':>12}"]
    for s in report.saves:
        lines.append(f"{s.kind:<8}{s.step:>6}{s.bytes / 1e9:>8.2f}{s.stall_s:>10.2f}{s.save_s:>9.2f}{s.gb_per_s:>7.2f}"
                     f"{s.over_raw:>10.2f}{s.stall_s / s.save_s:>12.1%}")
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", choices=tuple(DEFAULTS), default="cuda")
    parser.add_argument("--preset", help="model preset (default: 1b on CUDA, minimal on CPU)")
    parser.add_argument("--seq-len", type=int, help="tokens of the training step after each save")
    parser.add_argument("--saves", type=int, default=3, help="asynchronous saves before the final one")
    parser.add_argument("--dir", type=Path, default=Path("."), help="a folder on the disk to measure (default: here)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    for key, value in DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch starts
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("async_save: no CUDA device here; run it on a GPU machine, or pass --device cpu", file=sys.stderr)
        return 2
    args.dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="async-save-", dir=args.dir))
    try:
        report = measure(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\n".join(table(report)))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(asdict(report), out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
