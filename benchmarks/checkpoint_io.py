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

On object storage (--bucket, or an s3:// --dir), the same model and ranks,
interleaved in each repeat, against an S3 endpoint: AWS_ENDPOINT_URL's when
set (credentials from boto's chain), else moto's S3 server started on
loopback for the run (tests/object_store.py; in memory, so the ratios measure
our overhead, not a network):

- sharded save (sync): CheckpointManager to the committed checkpoint (shards
  streamed as multipart uploads, checksums, .metadata, the manifest written
  last, the lease checked before it);
- raw upload: every rank at once uploads one object as large as its shards
  with boto3's managed transfer, in parts of s3.PART_BYTES with
  bucket_files.UPLOAD_THREADS parts in flight per rank (our writer's part
  size and streams per rank);
- restore: a fresh CheckpointManager's restore(): every object verified
  against its manifest checksum, then loaded by ranged reads;
- raw download: every rank at once downloads its raw object the same way.

Prints the ratios save/raw upload and restore/raw download.

    .venv/bin/python benchmarks/checkpoint_io.py [--ranks 2,4] [--dir PATH] [--repeats 3] [--params 100]
    .venv/bin/python benchmarks/checkpoint_io.py --bucket --ranks 2 --params 10   # moto, or AWS_ENDPOINT_URL
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness import run_ranks  # noqa: E402  (N real gloo ranks)
from object_store import serve  # noqa: E402  (moto's S3 server on loopback)

from brain_trainer.checkpoint import CheckpointManager, TrainState, bucket, store  # noqa: E402
from brain_trainer.checkpoint.bucket import BucketPath  # noqa: E402
from brain_trainer.checkpoint.bucket_files import UPLOAD_THREADS  # noqa: E402
from brain_trainer.config import CheckpointConfig  # noqa: E402
from brain_trainer.s3 import PART_BYTES, client  # noqa: E402

WIDTH, LAYERS = 2880, 12  # 12 x (2880^2 + 2880) = 99.6M parameters (--params 100)
CHUNK = 8 << 20
BATCH = 64


def width_for(millions: float) -> int:
    """The layers' width (a multiple of 64) for about `millions` parameters in LAYERS square layers."""
    return max(64, round(math.sqrt(millions * 1e6 / LAYERS) / 64) * 64)


def parameters(width: int) -> int:
    return LAYERS * (width * width + width)


def build(width: int = WIDTH) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(LAYERS)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    train_step(model, optim)  # AdamW state (exp_avg, exp_avg_sq) now exists
    return model, optim


def train_step(model: nn.Module, optim: torch.optim.Optimizer) -> None:
    width = model[0].in_features
    model(torch.randn(BATCH, width)).square().mean().backward()
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


def bench(rank: int, world_size: int, base: str, repeats: int, width: int) -> dict:
    model, optim = build(width)
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


def slowest_of(per_rank: list[dict]) -> dict[str, float]:
    """Each timing's slowest rank (a collective step ends when its last rank does)."""
    return {key: max(r[key] for r in per_rank) for key in per_rank[0] if key not in ("bytes", "raw_bytes")}


def report(ranks: int, per_rank: list[dict], repeats: int, width: int) -> None:
    total = per_rank[0]["bytes"]
    raw_total = sum(r["raw_bytes"] for r in per_rank)
    slowest = slowest_of(per_rank)
    sync, raw, restore, raw_read = slowest["sync"], slowest["raw"], slowest["restore"], slowest["raw_read"]
    asynchronous = slowest["async"]
    print(f"model: {parameters(width) / 1e6:.1f}M parameters + AdamW state, FSDP2 full_shard over {ranks} gloo "
          f"ranks, torch {torch.__version__}; medians of {repeats}")
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


# -- on object storage --


def transfer_config():
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES,
                          max_concurrency=UPLOAD_THREADS)


def raw_upload(path: BucketPath, payload: bytes) -> None:
    client().upload_fileobj(io.BytesIO(payload), path.bucket, path.key, Config=transfer_config())


def raw_download(path: BucketPath) -> None:
    client().download_fileobj(path.bucket, path.key, io.BytesIO(), Config=transfer_config())


def bench_bucket(rank: int, world_size: int, base: str, repeats: int, width: int) -> dict:
    model, optim = build(width)
    state = TrainState(model, optim)
    root = BucketPath.of(base) / "ckpt"
    raw = BucketPath.of(base) / f"raw-{rank}.bin"
    results: dict[str, list[float]] = {"sync": [], "raw": [], "restore": [], "raw_read": []}
    nbytes = shard_bytes = 0

    def manager() -> CheckpointManager:
        cfg = CheckpointConfig(dir=str(root), interval_steps=1, keep_last=1, async_save=False)
        return CheckpointManager(cfg, rank=rank, world_size=world_size, config_hash="bench")

    for i in range(repeats):
        if rank == 0:
            bucket.delete_folder(root)
        dist.barrier()
        sync = manager()
        state.step = i + 1
        results["sync"].append(timed(lambda: sync.after_step(state, save=True)))
        sync.close()
        files = bucket.read_manifest(root / store.step_dir_name(state.step))["files"]
        nbytes = sum(f["size"] for f in files.values())
        shard_bytes = sum(f["size"] for name, f in files.items() if name.startswith(f"__{rank}_"))
        payload = os.urandom(shard_bytes)
        results["raw"].append(timed(lambda: raw_upload(raw, payload)))
        results["raw_read"].append(timed(lambda: raw_download(raw)))
        bucket.delete_keys(raw.bucket, [raw.key])
        restoring = manager()
        results["restore"].append(timed(lambda: restoring.restore(state)))
        restoring.close()
        assert state.step == i + 1
    dist.barrier()
    if rank == 0:
        bucket.delete_folder(root)
    return {"bytes": nbytes, "raw_bytes": shard_bytes, **{k: statistics.median(v) for k, v in results.items()}}


def report_bucket(ranks: int, per_rank: list[dict], repeats: int, width: int, endpoint: str) -> None:
    total = per_rank[0]["bytes"]
    raw_total = sum(r["raw_bytes"] for r in per_rank)
    slowest = slowest_of(per_rank)
    sync, raw, restore, raw_read = slowest["sync"], slowest["raw"], slowest["restore"], slowest["raw_read"]
    print(f"model: {parameters(width) / 1e6:.1f}M parameters + AdamW state, FSDP2 full_shard over {ranks} gloo "
          f"ranks, torch {torch.__version__}; medians of {repeats}; object store {endpoint}")
    print(f"  checkpoint size:         {total / 1e9:.3f} GB ({raw_total / 1e9:.3f} GB of shards)")
    print(f"  sharded save (sync):     {total / 1e9 / sync:6.3f} GB/s  ({sync:.2f} s to committed)")
    print(f"  raw parallel upload:     {raw_total / 1e9 / raw:6.3f} GB/s  ({raw:.2f} s, "
          f"{PART_BYTES >> 20} MiB parts, {UPLOAD_THREADS} in flight per rank)")
    print(f"  ratio save/raw upload:   {(total / sync) / (raw_total / raw):6.2f}")
    print(f"  restore (verify+load):   {total / 1e9 / restore:6.3f} GB/s  ({restore:.2f} s)")
    print(f"  raw parallel download:   {raw_total / 1e9 / raw_read:6.3f} GB/s  ({raw_read:.2f} s)")
    print(f"  ratio restore/raw download: {(total / restore) / (raw_total / raw_read):.2f}")
    sys.stdout.flush()


@contextlib.contextmanager
def object_store(where: str | None):
    """(an s3:// base prefix of its own, the endpoint in words) for the run, removed after.

    The endpoint is AWS_ENDPOINT_URL's when set, else moto's S3 server on loopback, started here (the ranks
    inherit its variables). `where` (s3://bucket/prefix) names a bucket that exists (on moto's server it is
    made); None: one is made.
    """
    with contextlib.ExitStack() as stack:
        endpoint = os.environ.get("AWS_ENDPOINT_URL")
        if not endpoint:
            server = serve()
            stack.callback(server.close)
            moto = next(server)
            saved = dict(os.environ)
            stack.callback(lambda: (os.environ.clear(), os.environ.update(saved)))
            os.environ.update(moto.env)
            endpoint = f"{moto.endpoint} (moto's server: in memory, on loopback)"
        if where is None or "moto" in endpoint:  # moto's server starts empty: its bucket is made too
            where = where or f"s3://ckpt-bench-{uuid.uuid4().hex[:12]}"
            client().create_bucket(Bucket=BucketPath.of(where).bucket)
            stack.callback(lambda: client().delete_bucket(Bucket=BucketPath.of(where).bucket))
        base = BucketPath.of(where) / f"ckpt-bench-{uuid.uuid4().hex[:8]}"
        stack.callback(lambda: bucket.delete_folder(base))
        yield str(base), endpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="2,4", help="comma-separated world sizes, each measured in turn")
    parser.add_argument("--dir", default=None, help="folder on the disk to measure (default: a temporary folder), "
                        "or s3://bucket/prefix (an existing bucket) to measure object storage")
    parser.add_argument("--bucket", action="store_true", help="measure object storage (a new bucket unless --dir "
                        "names one): AWS_ENDPOINT_URL's S3 endpoint, else moto's server on loopback")
    parser.add_argument("--params", type=float, default=100, help="model size in millions of parameters (100)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    width = width_for(args.params)
    in_bucket = str(args.dir or "").startswith(bucket.SCHEME)
    if args.bucket and args.dir and not in_bucket:
        parser.error(f"--dir: {args.dir!r} is not s3://bucket/prefix, which --bucket measures")
    for ranks in (int(n) for n in args.ranks.split(",")):
        if args.bucket or in_bucket:
            with object_store(args.dir if in_bucket else None) as (base, endpoint):
                per_rank = run_ranks(bench_bucket, ranks, base, args.repeats, width, timeout=1800)
            report_bucket(ranks, per_rank, args.repeats, width, endpoint)
            continue
        base = tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir)
        try:
            per_rank = run_ranks(bench, ranks, base, args.repeats, width, timeout=1800)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        report(ranks, per_rank, args.repeats, width)


if __name__ == "__main__":
    main()
