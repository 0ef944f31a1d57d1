"""A torch Dataset over one split of a prepared token dataset, read through numpy.memmap.

Item i is the window of seq_len + 1 tokens starting at token i x (seq_len + 1)
of the split's stream (non-overlapping, as data.ByteFileDataset cuts bytes;
a window may span two shards; the tail shorter than a window is unused),
returned as (input, target) int64 tensors shifted by one, so
RankAwareDataLoader and its global sample index work unchanged.

Resident memory: pages a memory map has read count as this process's
resident memory until they are unmapped, so reading through a large corpus
would grow it up to the corpus size. The dataset therefore drops its maps
after every RELEASE_BYTES it may have brought in and maps again on the next
read (the data stays in the page cache, which the kernel reclaims freely).
"""

from __future__ import annotations

import bisect
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .format import Manifest, check_seq_len, read_manifest, verify_split, windows

RELEASE_BYTES = 16 << 20
# A page fault maps up to this much of the file around the page (Linux fault_around_bytes, 64 KiB by default).
FAULT_AROUND_BYTES = 64 << 10


class TokenDataset(Dataset):
    """Windows of seq_len + 1 tokens over `split` ("train" or "validation") of the dataset folder `path`.

    Opening reads the manifest and verifies every shard of the split (size and
    CRC-32): a missing, truncated or damaged shard, or a split shorter than one
    window, raises DatasetError naming it before any training starts.
    """

    def __init__(self, path: str | Path, seq_len: int, split: str = "train"):
        self.path = Path(path)
        self.seq_len = seq_len
        self.split = split
        self.manifest: Manifest = read_manifest(self.path)
        check_seq_len(self.manifest, seq_len, (split,), where=str(self.path))
        verify_split(self.path, self.manifest, split)
        shards = self.manifest.split(split).shards
        self._files = [self.path / s.name for s in shards]
        self._starts = [0, *itertools.accumulate(s.tokens for s in shards)]  # token offset of each shard
        self._dtype = np.dtype(self.manifest.dtype).newbyteorder("<")
        self._len = windows(self._starts[-1], seq_len)
        self._maps: dict[int, np.ndarray] = {}
        self._unreleased = 0

    @property
    def vocab_size(self) -> int:
        return self.manifest.tokenizer.vocab_size

    @property
    def eot_id(self) -> int:
        return self.manifest.tokenizer.eot_id

    def __len__(self) -> int:
        return self._len

    def _shard(self, k: int) -> np.ndarray:
        if k not in self._maps:
            # A plain ndarray view of the memmap: slicing it skips memmap's per-view bookkeeping.
            self._maps[k] = np.memmap(self._files[k], dtype=self._dtype, mode="r").view(np.ndarray)
        return self._maps[k]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self._len:
            raise IndexError(f"window {index} of {self._len}")
        size = self.seq_len + 1
        start = index * size
        k = bisect.bisect_right(self._starts, start) - 1
        pieces = []
        while size:
            offset = start - self._starts[k]
            piece = self._shard(k)[offset : offset + size]
            pieces.append(piece)
            start, size, k = start + len(piece), size - len(piece), k + 1
        joined = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        window = torch.from_numpy(joined.astype(np.int64))  # a copy: nothing points into a map
        self._unreleased += len(pieces) * FAULT_AROUND_BYTES + window.numel() * self._dtype.itemsize
        if self._unreleased >= RELEASE_BYTES:
            self._maps.clear()  # unmaps: the pages read so far leave this process's resident set
            self._unreleased = 0
        return window[:-1], window[1:]

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers started by spawn receive a copy: maps are per process, made again on first read.
        return {**self.__dict__, "_maps": {}, "_unreleased": 0}
