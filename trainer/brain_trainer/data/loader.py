"""Training data and rank-aware loading.

The global sample stream is the concatenation of one seeded permutation of
the dataset per epoch: stream position p is sample `perm[p // N][p % N]`.
Ranks consume it in micro-batch-sized chunks dealt round-robin (chunk j goes
to rank j % world_size), so the global sequence never depends on the world
size or the micro-batch size: one process with batch 2b sees exactly what
rank 0's b followed by rank 1's b saw. A checkpoint stores the stream position
(the global sample index) and a resumed run starts there, at any world size.

Epoch tail: nothing is dropped and nothing is padded with repeats. A sampler
epoch holds every round (one chunk per rank) that starts inside that data
epoch, so all ranks take the same number of steps; when the dataset size is
not a multiple of micro_batch_size x world_size, the last round of an epoch is
completed with the first samples of the next epoch's permutation.
"""

from __future__ import annotations

import glob
import os
from typing import Iterator, Optional

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ..config import DataConfig, DistributedConfig
from ..config.presets import VOCAB_SIZE
from ..parallel.launcher import env_int
from .errors import DataError
from .tokens.source import open_split


def _windows(tokens: torch.Tensor, index: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    window = tokens[index * (seq_len + 1) : (index + 1) * (seq_len + 1)].long()
    return window[:-1], window[1:]


class ByteFileDataset(Dataset):
    """Text files matching a glob, read as bytes and cut into non-overlapping windows.

    Each item is (input, target): seq_len byte tokens and the same shifted by one.
    Files are concatenated in sorted path order, so the dataset is deterministic.
    """

    def __init__(self, pattern: str, seq_len: int):
        self.pattern = pattern
        self.seq_len = seq_len
        files = sorted(p for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p))
        if not files:
            raise DataError(f"no files match {pattern!r}", field="data.path")
        chunks = []
        for path in files:
            try:
                with open(path, "rb") as f:
                    chunks.append(f.read())
            except OSError as exc:
                raise DataError(f"cannot read {path}: {exc.strerror}", field="data.path") from None
        data = bytearray().join(chunks)  # writable, as torch.frombuffer wants, without a second copy
        self.num_files = len(files)
        self.tokens = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        self._len = len(data) // (seq_len + 1)
        if self._len == 0:
            raise DataError(f"files matching {pattern!r} hold {len(data)} bytes; one sequence needs seq_len + 1 = "
                            f"{seq_len + 1}", field="data.path")

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _windows(self.tokens, index, self.seq_len)


class SyntheticDataset(Dataset):
    """Deterministic byte sequences with learnable structure.

    A seeded successor table maps each token to the next one; 1 token in 10 is
    replaced by a random token. A model that learns the table brings the loss
    from ln(256) ~ 5.5 down towards ~0.9 nats. Item i depends only on (seed, i).
    """

    NOISE = 0.1

    def __init__(self, num_samples: int, seq_len: int, seed: int = 0):
        self.num_samples = num_samples
        self.seq_len = seq_len
        self.seed = seed
        g = torch.Generator().manual_seed(seed)
        self.successor = torch.randperm(VOCAB_SIZE, generator=g)
        self._successor = self.successor.tolist()

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index + 1)
        n = self.seq_len + 1
        noise = torch.randint(0, VOCAB_SIZE, (n,), generator=g).tolist()
        replaced = (torch.rand(n, generator=g) < self.NOISE).tolist()
        successor = self._successor
        seq = [noise[0]]
        for t in range(1, n):  # sequential by nature; plain ints keep it cheap
            seq.append(noise[t] if replaced[t] else successor[seq[-1]])
        tokens = torch.tensor(seq)
        return tokens[:-1], tokens[1:]


def build_dataset(data: DataConfig, seq_len: int, seed: int) -> Dataset:
    """The dataset a DataConfig names."""
    if data.source == "files":
        return ByteFileDataset(data.path, seq_len)
    if data.source == "tokens":
        return open_split(data.path, seq_len, "train")
    return SyntheticDataset(data.num_samples, seq_len, seed)


def rank_positions(
    epoch: int, dataset_len: int, micro_batch_size: int, world_size: int, rank: int, start_index: int = 0
) -> list[int]:
    """Stream positions that `rank` reads in sampler epoch `epoch` (pure; see the module docstring)."""
    round_size = micro_batch_size * world_size
    lo = max(epoch * dataset_len, start_index)
    hi = (epoch + 1) * dataset_len
    if hi <= lo:
        return []
    first = -(-(lo - start_index) // round_size)  # ceil: rounds that start in [lo, hi)
    last = -(-(hi - start_index) // round_size)
    out: list[int] = []
    for q in range(first, last):
        begin = start_index + q * round_size + rank * micro_batch_size
        out.extend(range(begin, begin + micro_batch_size))
    return out


class RankAwareSampler(DistributedSampler):
    """A DistributedSampler that deals a world-size-independent global stream in micro-batch chunks."""

    def __init__(
        self,
        dataset: Dataset,
        *,
        num_replicas: int,
        rank: int,
        micro_batch_size: int,
        seed: int = 0,
        start_index: int = 0,
        shuffle: bool = True,
    ):
        if start_index < 0:
            raise ValueError(f"start_index must be >= 0, got {start_index}")
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=False)
        self.micro_batch_size = micro_batch_size
        self.start_index = start_index
        self.epoch = start_index // len(dataset)
        self._perms: dict[int, torch.Tensor] = {}

    def permutation(self, epoch: int) -> torch.Tensor:
        """The dataset order of one data epoch (the same for every rank)."""
        if epoch not in self._perms:
            n = len(self.dataset)
            if self.shuffle:
                perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + epoch))
            else:
                perm = torch.arange(n)
            # An epoch's last round may reach into the next epoch: keep both, nothing older.
            self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
            self._perms[epoch] = perm
        return self._perms[epoch]

    def positions(self) -> list[int]:
        return rank_positions(
            self.epoch, len(self.dataset), self.micro_batch_size, self.num_replicas, self.rank, self.start_index
        )

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)
        positions = self.positions()
        # Lazily: an epoch can hold millions of windows, and a run may read only the first few of them.
        return (int(self.permutation(p // n)[p % n]) for p in positions)

    def __len__(self) -> int:
        return len(self.positions())


def _default_rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return env_int(os.environ, "RANK", default=0), env_int(os.environ, "WORLD_SIZE", default=1, minimum=1)


class RankAwareDataLoader:
    """Per-rank micro-batches from the shared global stream (no sample on two ranks within an epoch).

    rank and world_size default to the initialised process group, else the
    RANK / WORLD_SIZE environment, else a single process. start_index is the
    global sample index to resume from (a checkpoint's `sample_index`).
    """

    def __init__(
        self,
        dataset: Dataset,
        config: DistributedConfig,
        *,
        micro_batch_size: int = 8,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        seed: int = 0,
        start_index: int = 0,
        num_workers: int = 0,
    ):
        default_rank, default_world = _default_rank_world()
        self.dataset = dataset
        self.config = config
        self.micro_batch_size = micro_batch_size
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world if world_size is None else world_size
        self.num_workers = num_workers
        self._sampler = RankAwareSampler(
            dataset,
            num_replicas=self.world_size,
            rank=self.rank,
            micro_batch_size=micro_batch_size,
            seed=seed,
            start_index=start_index,
        )
        self._loader: Optional[DataLoader] = None

    def get_sampler(self) -> DistributedSampler:
        return self._sampler

    def get_loader(self) -> DataLoader:
        if self._loader is None:
            cuda = self.config.resolved_backend(torch.cuda.is_available()) == "nccl"
            self._loader = DataLoader(
                self.dataset,
                batch_size=self.micro_batch_size,
                sampler=self._sampler,
                num_workers=self.num_workers,
                pin_memory=cuda,
                persistent_workers=self.num_workers > 0,
            )
        return self._loader

    def set_epoch(self, epoch: int) -> None:
        """Select the data epoch to read (its own seeded order)."""
        self._sampler.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self._sampler.epoch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Micro-batches forever, moving to the next epoch as each one ends."""
        loader = self.get_loader()
        while True:
            yield from loader
            self.set_epoch(self.epoch + 1)
