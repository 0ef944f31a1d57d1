"""A torch Dataset over one split of a prepared token dataset, read through memory maps.

Item i is the window of seq_len + 1 tokens starting at token i x (seq_len + 1)
of the split's stream (non-overlapping, as data.ByteFileDataset cuts bytes;
a window may span two shards; the tail shorter than a window is unused),
returned as (input, target) int64 tensors shifted by one, so
RankAwareDataLoader and its global sample index work unchanged.

Resident memory: pages a memory map has read count as this process's
resident memory until they are unmapped, so reading through a large corpus
would grow it up to the corpus size. The dataset therefore tells the kernel
(madvise MADV_DONTNEED) to drop its mappings after every RELEASE_BYTES it may
have brought in; the data stays in the page cache, which the kernel reclaims
freely, and the next read maps it again. Each shard is a numpy array over an
`mmap.mmap` (what numpy.memmap builds) so that the map itself is at hand.

Token ids: the model's vocabulary is the tokenizer's (data/tokens/source.py),
and an id at or past it fails on the GPU as a device-side assert far from its
cause. Opening therefore takes the maximum of every shard, one vectorised pass
over the memory map right after the CRC-32 pass has brought its pages into the
page cache (memory bandwidth: about a tenth of a second per GiB), and a shard
holding an id outside the vocabulary is a DataError naming the file, the first
such id and its position.
"""

from __future__ import annotations

import itertools
import mmap
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import DataError
from .format import MANIFEST, Manifest, check_seq_len, read_manifest, verify_split, window_pieces, windows

RELEASE_BYTES = 16 << 20
# What one read may add to the resident set: Linux maps a whole 2 MiB folio of the page cache at a fault.
MAPPED_PER_READ = 2 << 20


class TokenDataset(Dataset):
    """Windows of seq_len + 1 tokens over `split` ("train" or "validation") of the dataset folder `path`.

    Opening reads the manifest and verifies every shard of the split (size and
    CRC-32, then every id inside the vocabulary): a missing, truncated or damaged
    shard, one holding an id the model has no embedding for, or a split shorter
    than one window, raises DataError naming it before any training starts.
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
        self._maps: dict[int, tuple[mmap.mmap, np.ndarray]] = {}
        self._touched: set[int] = set()
        self._unreleased = 0
        for k in range(len(self._files)):
            self._check_ids(k)
        self._release()

    def _check_ids(self, k: int) -> None:
        tokens = self._shard(k)
        if len(tokens) == 0 or int(tokens.max()) < self.vocab_size:
            return
        position = int(np.argmax(tokens >= self.vocab_size))  # the first id past the vocabulary
        raise DataError(
            f"{self._files[k]}: token id {int(tokens[position])} at token {position} is outside the tokenizer's "
            f"vocabulary of {self.vocab_size} ids (the file does not match {self.path / MANIFEST})"
        )

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
            with open(self._files[k], "rb") as f:
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[k] = (mapped, np.frombuffer(mapped, dtype=self._dtype))
        self._touched.add(k)
        return self._maps[k][1]

    def _release(self) -> None:
        for k in self._touched:
            self._maps[k][0].madvise(mmap.MADV_DONTNEED)
        self._touched.clear()
        self._unreleased = 0

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self._len:
            raise IndexError(f"window {index} of {self._len}")
        size = self.seq_len + 1
        pieces = [self._shard(k)[offset : offset + count]
                  for k, offset, count in window_pieces(self._starts, index * size, size)]
        joined = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        window = torch.from_numpy(joined.astype(np.int64))  # a copy: nothing points into a map
        self._unreleased += len(pieces) * MAPPED_PER_READ + window.numel() * self._dtype.itemsize
        if self._unreleased >= RELEASE_BYTES:
            self._release()
        return window[:-1], window[1:]

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers started by spawn receive a copy: maps are per process, made again on first read.
        return {**self.__dict__, "_maps": {}, "_touched": set(), "_unreleased": 0}
