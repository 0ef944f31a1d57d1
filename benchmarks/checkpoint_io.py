"""Checkpoint I/O against the disk's own limits (a benchmark, not a test).

A ~100M-parameter model, FSDP2 full_shard over gloo ranks, with AdamW state
(~1.2 GB in fp32), is checkpointed through CheckpointManager. Side by side,
on the same disk and with the same ranks, interleaved in each repeat:

- sharded save: a synchronous save of the whole TrainState, from the call to
  the committed checkpoint (shards fsynced, checksums, manifest, rename);
- raw write: every rank at once writes as many bytes as its shard with plain
  sequential 8 MiB writes and one fsync (the physical limit);
- restore: a fresh CheckpointManager's restore(), from the call to the loaded
  state: every file verified against its manifest checksum, then loaded;
- raw read: every rank at once reads its raw-write file back sequentially in
  8 MiB pieces. Before both reads the files' pages are dropped from the page
  cache (posix_fadvise DONTNEED on each file, after fsync: it needs no
  privileges, unlike /proc/sys/vm/drop_caches), so both come from the disk;
- async save: an asynchronous save's wall time from the call to the
  committed checkpoint, with nothing else running (a manager that saved once
  already: its staging buffers exist);
- async stall: how long an asynchronous save blocks a training loop, as a
  fraction of the synchronous save: the call itself plus any wait before the
  next optimizer step for the background copy to CPU memory. One training
  step (forward, backward, AdamW) follows each save, as in the loop. The
  first save of a manager is shown apart: its staging buffers were allocated
  after its first optimizer step, before the save (checkpoint/staging.py).

Prints, per world size, GB/s for each, the ratios save/raw write for the
blocking and the asynchronous save (target >= 0.7) and restore/raw read
(target >= 0.6), and the stall fraction (target <= 0.05). Medians over
--repeats runs.

    .venv/bin/python benchmarks/checkpoint_io.py [--ranks 2,4] [--dir PATH] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness import run_ranks  # noqa: E402  (N real gloo ranks)

from brain_trainer.checkpoint import CheckpointManager, TrainState, store  # noqa: E402
from brain_trainer.config import CheckpointConfig  # noqa: E402

WIDTH, LAYERS = 2880, 12  # 12 x (2880^2 + 2880) = 99.6M parameters
CHUNK = 8 << 20
BATCH = 64


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    train_step(model, optim)  # AdamW state (exp_avg, exp_avg_sq) now exists
    return model, optim


def train_step(model: nn.Module, optim: torch.optim.Optimizer) -> None:
    model(torch.randn(BATCH, WIDTH)).square().mean().backward()
    optim.step()
    optim.zero_grad()


def timed(fn) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def raw_write(path: Path, nbytes: int) -> None:
    block = memoryview(os.urandom(CHUNK))
    with open(path, "wb", buffering=0) as f:
        left = nbytes
        while left > 0:
            left -= f.write(block[: min(CHUNK, left)])
        os.fsync(f.fileno())


def raw_read(path: Path) -> None:
    buf = bytearray(CHUNK)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def drop_cache(*paths: Path) -> None:
    """Evict the files' (clean, fsynced) pages from the page cache, so that the next read is the disk's."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def bench(rank: int, world_size: int, base: str, repeats: int) -> dict:
    model, optim = build()
    state = TrainState(model, optim)
    root = Path(base) / "ckpt"
    raw = Path(base) / f"raw-{rank}.bin"
    results: dict[str, list[float]] = {"sync": [], "raw": [], "restore": [], "raw_read": [], "first_stall": [],
                                       "stall": [], "async": [], "async_total": [], "step": []}
    nbytes = shard_bytes = 0

    def manager(**overrides) -> CheckpointManager:
        cfg = CheckpointConfig(dir=str(root), interval_steps=1, keep_last=1, **overrides)
        return CheckpointManager(cfg, rank=rank, world_size=world_size, config_hash="bench")

    for i in range(repeats):
        if rank == 0:
            shutil.rmtree(root, ignore_errors=True)
        dist.barrier()
        sync = manager(async_save=False)
        state.step = 2 * i + 1
        results["sync"].append(timed(lambda: sync.after_step(state, save=True)))
        sync.close()
        folder = root / store.step_dir_name(state.step)
        manifest = store.read_manifest(folder)
        nbytes = sum(f["size"] for f in manifest["files"].values())
        shard_bytes = manifest["files"][f"__{rank}_0.distcp"]["size"]
        results["raw"].append(timed(lambda: raw_write(raw, shard_bytes)))

        drop_cache(raw, *sorted(folder.iterdir()))
        results["raw_read"].append(timed(lambda: raw_read(raw)))
        raw.unlink()
        restoring = manager()
        results["restore"].append(timed(lambda: restoring.restore(state)))
        restoring.close()
        assert state.step == 2 * i + 1

        asynchronous = manager()
        state.step = 1000 * (i + 1)
        results["step"].append(timed(lambda: train_step(model, optim)))
        for save in range(3):  # the first save, then two with the buffers in place
            state.step += 1
            if save == 1:
                results["async"].append(timed(lambda: (asynchronous.after_step(state, save=True), asynchronous.wait())))
                continue
            results["async_total"].append(timed(lambda: (asynchronous.after_step(state, save=True),
                                                         train_step(model, optim), asynchronous.wait())))
            results["first_stall" if save == 0 else "stall"].append(asynchronous.last_stall_s)
        asynchronous.close()
    if rank == 0:
        shutil.rmtree(root, ignore_errors=True)
    return {"bytes": nbytes, "raw_bytes": shard_bytes, **{k: statistics.median(v) for k, v in results.items()}}


def report(ranks: int, per_rank: list[dict], repeats: int) -> None:
    total = per_rank[0]["bytes"]
    raw_total = sum(r["raw_bytes"] for r in per_rank)
    slowest = {key: max(r[key] for r in per_rank) for key in per_rank[0] if key not in ("bytes", "raw_bytes")}
    sync, raw, restore, raw_read = slowest["sync"], slowest["raw"], slowest["restore"], slowest["raw_read"]
    asynchronous = slowest["async"]
    params = LAYERS * (WIDTH * WIDTH + WIDTH)
    print(f"model: {params / 1e6:.1f}M parameters + AdamW state, FSDP2 full_shard over {ranks} gloo ranks, "
          f"torch {torch.__version__}; medians of {repeats}")
    print(f"  checkpoint size:       {total / 1e9:.3f} GB ({raw_total / 1e9:.3f} GB of shards)")
    print(f"  sharded save (sync):   {total / 1e9 / sync:6.2f} GB/s  ({sync:.2f} s to committed)")
    print(f"  raw sequential write:  {raw_total / 1e9 / raw:6.2f} GB/s  ({raw:.2f} s incl. fsync)")
    print(f"  async save:            {total / 1e9 / asynchronous:6.2f} GB/s  ({asynchronous:.2f} s to committed)")
    print(f"  ratio save/raw write:  {(total / sync) / (raw_total / raw):6.2f} sync, "
          f"{(total / asynchronous) / (raw_total / raw):.2f} async   (target >= 0.7)")
    print(f"  restore (verify+load): {total / 1e9 / restore:6.2f} GB/s  ({restore:.2f} s, page cache dropped)")
    print(f"  raw sequential read:   {raw_total / 1e9 / raw_read:6.2f} GB/s  ({raw_read:.2f} s, page cache dropped)")
    print(f"  ratio restore/raw read:{(total / restore) / (raw_total / raw_read):6.2f}   (target >= 0.6)")
    print(f"  async save: loop stall {slowest['stall']:.3f} s = {slowest['stall'] / sync:.3f} of a sync save   "
          f"(target <= 0.05); the first save's {slowest['first_stall']:.3f} s; training step alone "
          f"{slowest['step']:.2f} s; async save + one step, to committed {slowest['async_total']:.2f} s")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="2,4", help="comma-separated world sizes, each measured in turn")
    parser.add_argument("--dir", default=None, help="folder on the disk to measure (default: a temporary folder)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for ranks in (int(n) for n in args.ranks.split(",")):
        base = tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir)
        try:
            per_rank = run_ranks(bench, ranks, base, args.repeats, timeout=1800)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        report(ranks, per_rank, args.repeats)


if __name__ == "__main__":
    main()
