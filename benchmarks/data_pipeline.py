"""The token data pipeline: prepare throughput, loader throughput, resident memory (a benchmark, not a test).

    .venv/bin/python benchmarks/data_pipeline.py [--corpus-mb 8] [--threads 1 2] [--repeats 2] [--dataset-gb 2]

1. prepare: MB of text per second through `python -m brain_trainer.tokens.prepare`
   with a BPE tokenizer file (4,096 ids) and --workers N, against the tokenizers
   library's own `encode_batch` on the same documents with N threads
   (RAYON_NUM_THREADS=N). Each side runs in a fresh process and times only its
   work; prepare's time includes reading and parsing JSON Lines, the split hash,
   worker start-up, shard writes, checksums and fsyncs. Target ratio >= 0.8.
2. loader: tokens per second that one rank's RankAwareDataLoader draws from a
   TokenDataset, against the tokens per second the `minimal` preset trains on one
   rank (a short real training loop, same micro-batch and seq_len). Target >= 20x.
3. memory: growth of this process's peak resident set while reading every
   window of a synthetic 2 GB token dataset once, in shuffled order (deleted
   afterwards). Target <= 64 MB. For comparison, the same read through plain
   numpy.memmap arrays, and one epoch through RankAwareDataLoader (whose
   sampler lists every index of an epoch: that part grows with the corpus).

The corpus is the Python standard library's own sources.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

PY = sys.executable
HERE = Path(__file__).resolve()
MICRO_BATCH, SEQ_LEN = 8, 128
VOCAB = 4096
SHARD_TOKENS = 1 << 28


def corpus_jsonl(folder: Path, megabytes: float) -> tuple[Path, int]:
    """Standard-library sources as one JSON Lines file of about `megabytes` of text; (path, text bytes)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    total, path = 0, folder / "corpus.jsonl"
    with open(path, "w", encoding="utf-8") as out:
        for source in sorted(stdlib.rglob("*.py")):
            if "site-packages" in source.parts:
                continue
            try:
                text = source.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            out.write(json.dumps({"text": text}) + "\n")
            total += len(text.encode())
            if total >= megabytes * 1e6:
                break
    return path, total


def child(kind: str, *args: str) -> float:
    """Run one measured side in a fresh process; returns the seconds it reports."""
    threads = args[-1]
    env = {**os.environ, "RAYON_NUM_THREADS": threads}
    done = subprocess.run([PY, str(HERE), "--child", kind, *args], env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"{kind} child failed:\n{done.stderr}")
    return float(done.stdout.split()[-1])


def child_encode(method: str, corpus: str, tokenizer: str, threads: str) -> None:
    from tokenizers import Tokenizer

    texts = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
    encode = getattr(Tokenizer.from_file(tokenizer), method)
    start = time.perf_counter()
    encode(texts, add_special_tokens=False)
    print(time.perf_counter() - start)


def child_prepare(corpus: str, tokenizer: str, out: str, threads: str) -> None:
    from brain_trainer.data.tokens.options import PrepareOptions
    from brain_trainer.data.tokens.prepare import prepare

    options = PrepareOptions(inputs=[corpus], out=out, tokenizer=tokenizer, workers=int(threads), force=True)
    with open(os.devnull, "w") as quiet:
        start = time.perf_counter()
        prepare(options, stream=quiet)
        print(time.perf_counter() - start)


def child_train(steps: str, threads: str) -> None:
    from brain_trainer.config import TrainerConfig
    from brain_trainer.loop.train import train

    cfg = TrainerConfig.from_dict({
        "model": {"preset": "minimal"},
        "training": {"steps": int(steps), "micro_batch_size": MICRO_BATCH, "seq_len": SEQ_LEN, "log_interval": int(steps)},
        "distributed": {"strategy": "single"},
        "data": {"source": "files", "path": str(Path(sysconfig.get_paths()["stdlib"]) / "*.py")},
        "checkpoint": {"enabled": False},
        "metrics": {"port": 0},
    })
    print(train(cfg).tokens_per_second)


def bench_prepare(tmp: Path, megabytes: float, thread_counts: list[int], repeats: int) -> None:
    from brain_trainer.data.tokens.corpus import Corpus
    from brain_trainer.data.tokens.tokenizer import train_bpe

    corpus, text_bytes = corpus_jsonl(tmp, megabytes)
    tokenizer = tmp / "tokenizer.json"
    sample = [text for text, _ in Corpus([corpus]).documents()][:300]
    train_bpe(sample, VOCAB).tokenizer.save(str(tokenizer))
    mb = text_bytes / 1e6
    print(f"prepare: {mb:.1f} MB of standard-library sources, BPE tokenizer of {VOCAB} ids, median of {repeats}")
    print("  (prepare uses encode_batch_fast, which skips the offsets it does not need; shown for reference)")
    print(f"  {'threads':>7s} {'encode_batch':>12s} {'encode_batch_fast':>17s} {'prepare':>8s}  MB/s   "
          f"{'prepare/encode_batch':>20s}")
    for threads in thread_counts:
        runs: dict[str, list[float]] = {"encode_batch": [], "encode_batch_fast": [], "prepare": []}
        for _ in range(repeats):  # interleaved: load drift on a shared machine hits every side alike
            for method in ("encode_batch", "encode_batch_fast"):
                runs[method].append(child("encode", method, str(corpus), str(tokenizer), str(threads)))
            runs["prepare"].append(child("prepare", str(corpus), str(tokenizer), str(tmp / "ds"), str(threads)))
        plain, fast, prepare = (mb / statistics.median(runs[k]) for k in runs)
        print(f"  {threads:7d} {plain:12.2f} {fast:17.2f} {prepare:8.2f}        {prepare / plain:20.2f}   "
              "(target >= 0.8)")


def synthetic_dataset(folder: Path, gigabytes: float) -> Path:
    """A dataset of random uint16 ids, written as prepare writes one."""
    from brain_trainer.data.tokens.tokenizer import ByteTokenizer
    from brain_trainer.data.tokens.writer import DatasetWriter

    tokens, chunk = int(gigabytes * 1e9) // 2, 1 << 25
    rng = np.random.default_rng(0)
    with DatasetWriter(folder, "uint16", SHARD_TOKENS) as writer:
        for start in range(0, tokens, chunk):
            writer.write("train", rng.integers(0, 257, min(chunk, tokens - start), dtype=np.uint16), 1)
        writer.write("validation", rng.integers(0, 257, 1 << 16, dtype=np.uint16), 1)
        writer.commit(ByteTokenizer().info(), 0.0, 0, ["synthetic"], 0)
    return folder


def rss_now() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))


def peak_growth(read: Callable[[], None]) -> int:
    """Growth of the peak resident set during read() (Linux: clear_refs 5 resets the peak to now)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = rss_now()
    read()
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))
    return peak - before


def bench_loader(path: Path, steps: int) -> None:
    import torch

    from brain_trainer.config import DistributedConfig
    from brain_trainer.data.loader import RankAwareDataLoader
    from brain_trainer.data.tokens.dataset import TokenDataset

    consumed = child("train", str(steps), str(torch.get_num_threads()))
    start = time.perf_counter()
    dataset = TokenDataset(path, SEQ_LEN)  # verifies every shard: sizes and CRC-32
    opened = time.perf_counter() - start
    loader = RankAwareDataLoader(dataset, DistributedConfig(), micro_batch_size=MICRO_BATCH, rank=0, world_size=1, seed=0)
    batches = iter(loader)
    next(batches)  # the epoch's permutation is drawn at the first batch
    n = 5000
    start = time.perf_counter()
    for _ in range(n):
        next(batches)
    drawn = n * MICRO_BATCH * SEQ_LEN / (time.perf_counter() - start)
    print(f"loader: micro-batch {MICRO_BATCH}, seq_len {SEQ_LEN}, one rank, shuffled windows of {path.name} "
          f"(opening it, which verifies every shard, took {opened:.1f} s)")
    print(f"  minimal preset trains {consumed:,.0f} tokens/s ({steps} steps); RankAwareDataLoader draws {drawn:,.0f} "
          f"tokens/s; ratio {drawn / consumed:.0f}x   (target >= 20x)")


def bench_memory(path: Path) -> None:
    from brain_trainer.config import DistributedConfig
    from brain_trainer.data.loader import RankAwareDataLoader
    from brain_trainer.data.tokens.dataset import TokenDataset
    from brain_trainer.data.tokens.format import read_manifest

    seq_len = 2047
    ds = TokenDataset(path, seq_len)
    order = np.random.default_rng(0).permutation(len(ds)).tolist()  # made before measuring
    manifest = read_manifest(path)
    gb = manifest.train.tokens * 2 / 1e9

    def through_dataset() -> None:
        for i in order:
            ds[i]

    def through_memmaps() -> None:  # every shard but the last holds SHARD_TOKENS ids
        maps = [np.memmap(path / s.name, dtype="<u2", mode="r") for s in manifest.train.shards]
        for i in order:
            k, offset = divmod(i * (seq_len + 1), SHARD_TOKENS)
            window = maps[k][offset : offset + seq_len + 1]
            if len(window) <= seq_len:  # the window crosses into the next shard
                window = np.concatenate([window, maps[k + 1][: seq_len + 1 - len(window)]])
            window.astype(np.int64)

    def one_epoch() -> None:
        loader = RankAwareDataLoader(ds, DistributedConfig(), micro_batch_size=MICRO_BATCH, rank=0, world_size=1)
        for _ in loader.get_loader():
            pass

    print(f"memory: every window (seq_len {seq_len}) of {gb:.2f} GB of tokens once, shuffled; peak resident growth")
    print(f"  TokenDataset                 {peak_growth(through_dataset) / 2**20:8.1f} MB   (target <= 64 MB)")
    print(f"  plain numpy.memmap reads     {peak_growth(through_memmaps) / 2**20:8.1f} MB   (for comparison)")
    print(f"  RankAwareDataLoader, 1 epoch {peak_growth(one_epoch) / 2**20:8.1f} MB   "
          f"(includes the sampler's index lists: {len(ds):,} windows)")


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        kind, *args = sys.argv[2:]
        {"encode": child_encode, "prepare": child_prepare, "train": child_train}[kind](*args)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus-mb", type=float, default=8.0)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, len(os.sched_getaffinity(0))])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--train-steps", type=int, default=60)
    parser.add_argument("--dataset-gb", type=float, default=2.0)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the synthetic dataset goes (a disk, not tmpfs)")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="data-pipeline-", dir=args.dir) as tmp:
        bench_prepare(Path(tmp), args.corpus_mb, sorted(set(args.threads)), args.repeats)
    with tempfile.TemporaryDirectory(prefix="data-pipeline-", dir=args.dir) as tmp:
        path = synthetic_dataset(Path(tmp) / f"random-{args.dataset_gb:g}GB", args.dataset_gb)
        bench_loader(path, args.train_steps)
        bench_memory(path)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
