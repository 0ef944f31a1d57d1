"""TokenDataset: windows for RankAwareDataLoader, copies for loader workers, resident memory that stays flat."""

from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest
import torch
from processes import run

from brain_trainer.config import DistributedConfig
from brain_trainer.data.loader import RankAwareDataLoader
from brain_trainer.data.tokens import dataset as dataset_module
from brain_trainer.data.tokens.dataset import TokenDataset
from brain_trainer.data.tokens.tokenizer import ByteTokenizer
from brain_trainer.data.tokens.writer import DatasetWriter

SEQ_LEN = 31


def make_dataset(path, tokens: np.ndarray, shard_tokens: int, held_out: int = 64):
    """A dataset folder of the given train stream (written as prepare writes one)."""
    with DatasetWriter(path, "uint16", shard_tokens) as writer:
        writer.write("train", tokens, 1)
        writer.write("validation", np.arange(held_out, dtype=np.uint16), 1)
        writer.commit(ByteTokenizer().info(), 0.1, 0, ["synthetic"], 0)
    return path


@pytest.fixture(scope="module")
def counting(tmp_path_factory):
    """Token t of the train stream is t % 257: every window shows where it was read from."""
    stream = (np.arange(20_000) % 257).astype(np.uint16)
    return make_dataset(tmp_path_factory.mktemp("tokens") / "ds", stream, shard_tokens=3000), stream


def test_windows_are_consecutive_and_cross_shards(counting):
    path, stream = counting
    ds = TokenDataset(path, SEQ_LEN)
    assert len(ds) == len(stream) // (SEQ_LEN + 1)
    for i in range(len(ds)):
        x, y = ds[i]
        window = stream[i * (SEQ_LEN + 1) : (i + 1) * (SEQ_LEN + 1)]
        assert x.tolist() == window[:-1].tolist() and y.tolist() == window[1:].tolist()
    with pytest.raises(IndexError):
        ds[len(ds)]
    copy = pickle.loads(pickle.dumps(ds))  # what a spawned DataLoader worker receives
    assert torch.equal(copy[93][0], ds[93][0])


def test_rank_aware_loading_reads_one_global_stream(counting):
    path, _ = counting
    ds = TokenDataset(path, SEQ_LEN)
    cfg = DistributedConfig()

    def rounds(world, micro, start=0, steps=6):
        its = [iter(RankAwareDataLoader(ds, cfg, micro_batch_size=micro, rank=r, world_size=world, seed=5,
                                        start_index=start)) for r in range(world)]
        out = []
        for _ in range(steps):
            for it in its:
                x, y = next(it)
                assert x.dtype == y.dtype == torch.int64 and x.shape == (micro, SEQ_LEN)
                out.extend(x.tolist())
        return out

    one = rounds(1, 4, steps=12)
    assert rounds(2, 2, steps=12) == one
    assert rounds(3, 2, start=12, steps=6) == one[12:48]  # resumed at sample 12 on another world size


def resident_file_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("RssFile:"))


def test_reading_through_the_corpus_keeps_resident_memory_flat(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 257, 40 << 20, dtype=np.uint16)  # 80 MB of shards
    ds = TokenDataset(make_dataset(tmp_path / "big", tokens, shard_tokens=8 << 20), 4095)
    before = peak = resident_file_bytes()
    for n, i in enumerate(np.random.default_rng(1).permutation(len(ds))):
        ds[int(i)]
        if n % 64 == 0:
            peak = max(peak, resident_file_bytes())
    assert peak - before < 2 * dataset_module.RELEASE_BYTES, (peak - before) >> 20


def test_prepare_command_line_stays_light():
    """`braintrain` builds prepare's parser without numpy, tokenizers or torch (the operator image has none)."""
    code = ("import sys, brain_operator.cli, brain_trainer.data.tokens.format; "
            "print([m for m in ('numpy', 'tokenizers', 'torch') if m in sys.modules])")
    done = run([sys.executable, "-c", code], timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
