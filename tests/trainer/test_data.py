"""Rank-aware loading: disjoint, covering, seeded, world-size independent, resumable."""

import itertools

import pytest
import torch

from brain_trainer.config import DataConfig, DistributedConfig
from brain_trainer.data.loader import ByteFileDataset, RankAwareDataLoader, SyntheticDataset, build_dataset
from brain_trainer.schema import ConfigError


class Indices(torch.utils.data.Dataset):
    """Item i is i, so batches show exactly which samples a rank read."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def loaders(n, world, micro, **kw):
    return [
        RankAwareDataLoader(Indices(n), DistributedConfig(), micro_batch_size=micro, rank=r, world_size=world, **kw)
        for r in range(world)
    ]


def epoch_indices(loader, epoch):
    loader.set_epoch(epoch)
    return list(loader.get_sampler())


def global_stream(n, world, micro, micro_steps, **kw):
    """The samples in the order the whole job consumes them: round by round, rank by rank."""
    its = [iter(loader) for loader in loaders(n, world, micro, **kw)]
    out = []
    for _ in range(micro_steps):
        for it in its:
            out.extend(next(it).tolist())
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n,micro", [(24, 2), (25, 2), (37, 3), (5, 4)])
def test_each_epoch_is_dealt_to_ranks_disjointly_and_completely(world, n, micro):
    ranks = loaders(n, world, micro)
    consumed = []
    for epoch in range(4):
        per_rank = [epoch_indices(loader, epoch) for loader in ranks]
        # every rank takes the same number of micro-batches
        assert len({len(ix) for ix in per_rank}) == 1 and len(per_rank[0]) % micro == 0
        for rnd in range(len(per_rank[0]) // micro):
            for ix in per_rank:
                consumed.extend(ix[rnd * micro : (rnd + 1) * micro])
        if n % (micro * world) == 0:
            flat = sorted(itertools.chain.from_iterable(per_rank))
            assert flat == list(range(n)), "an aligned epoch is exactly the dataset, each sample on one rank"
    # Documented tail: the last round of an epoch completes with the next epoch's first samples,
    # so in the consumed stream every data epoch (n consecutive samples) is a permutation.
    full_epochs = len(consumed) // n
    assert full_epochs >= 3
    for e in range(full_epochs):
        assert sorted(consumed[e * n : (e + 1) * n]) == list(range(n))


def test_set_epoch_reorders_and_is_reproducible():
    a, b = loaders(64, 2, 4)[0], loaders(64, 2, 4)[0]
    assert epoch_indices(a, 0) == epoch_indices(b, 0)
    assert epoch_indices(a, 1) == epoch_indices(b, 1)
    assert epoch_indices(a, 0) != epoch_indices(a, 1)
    assert epoch_indices(a, 0) != epoch_indices(loaders(64, 2, 4, seed=1)[0], 0)


@pytest.mark.parametrize("world,micro", [(2, 3), (3, 2), (4, 1), (1, 6)])
def test_global_sequence_does_not_depend_on_world_size(world, micro):
    n = 50  # not a multiple of 6: the sequence runs across epoch tails too
    reference = global_stream(n, 1, 6, 30)
    assert global_stream(n, world, micro, 30 * 6 // (world * micro)) == reference


@pytest.mark.parametrize("start", [0, 7, 48, 50, 123])
@pytest.mark.parametrize("world,micro", [(1, 4), (2, 2), (3, 1)])
def test_start_index_resumes_the_global_sequence_at_any_world_size(start, world, micro):
    n = 50
    reference = global_stream(n, 2, 3, 60)  # the run that wrote the checkpoint: world 2, micro 3
    steps = 40 // (world * micro)
    resumed = global_stream(n, world, micro, steps, start_index=start)
    assert resumed == reference[start : start + steps * world * micro]


def test_synthetic_items_are_deterministic_and_shifted():
    a, b = SyntheticDataset(100, 16, seed=5), SyntheticDataset(100, 16, seed=5)
    x, y = a[42]
    assert torch.equal(x, b[42][0]) and torch.equal(x[1:], y[:-1])
    assert x.shape == (16,) and int(x.max()) < 256
    assert not torch.equal(x, a[43][0])
    assert not torch.equal(x, SyntheticDataset(100, 16, seed=6)[42][0])


def test_synthetic_sequences_follow_a_learnable_successor_table():
    ds = SyntheticDataset(200, 32, seed=0)
    hits = total = 0
    for i in range(200):
        x, y = ds[i]
        hits += int((ds.successor[x] == y).sum())
        total += y.numel()
    assert 0.85 < hits / total < 0.95  # 1 token in 10 is noise


def test_byte_files_are_windows_in_sorted_file_order(tmp_path):
    (tmp_path / "b.txt").write_bytes(b"0123456789")
    (tmp_path / "a.txt").write_bytes(b"abcdefgh")
    (tmp_path / "sub").mkdir()  # folders matching the glob are skipped
    ds = ByteFileDataset(str(tmp_path / "*"), seq_len=5)
    assert len(ds) == 3  # 18 bytes // (5 + 1)
    x, y = ds[1]
    assert bytes(x.tolist()) == b"gh012" and bytes(y.tolist()) == b"h0123"
    assert build_dataset(DataConfig(source="files", path=str(tmp_path / "*.txt")), 5, 0).tokens.numel() == 18


def test_byte_files_errors_name_data_path_and_the_glob(tmp_path):
    pattern = str(tmp_path / "*.txt")
    with pytest.raises(ConfigError) as missing:
        ByteFileDataset(pattern, seq_len=8)
    (tmp_path / "tiny.txt").write_bytes(b"12345")
    with pytest.raises(ConfigError) as short:
        ByteFileDataset(pattern, seq_len=8)
    for exc in (missing.value, short.value):
        (err,) = exc.errors
        assert err.path == "data.path" and pattern in err.message
    assert "no files match" in str(missing.value) and "5 bytes" in str(short.value)
